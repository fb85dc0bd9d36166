"""The live fleet page: one self-contained HTML document from a gateway's fleet state.

`render_dashboard(fleet)` takes the `GET /admin/fleet` document (see docs/gateway.md: policy,
safe mode, decisions by reason, and per backend its queue, running batch, KV usage, prefix hit
rate, observed TTFT/TPOT, scrape age and recent selections with reasons and scores) and
returns a page that shows it at once and then polls `poll_path` every `interval_s` with the
bearer token taken from the page's own `?token=` query. Each poll is remembered for
`history_s`, and per backend the page draws its last minutes of TTFT, TPOT, queue and KV usage
as small inline SVG charts (`CHART_SERIES`; each scaled to what it shows, its unit and top value
written beside it). No external assets: style and script are inline, values are written with
`textContent` (never parsed as markup) and chart points are numbers only. Standard library
only, so a server can serve it without pulling in the report figures.
"""

from __future__ import annotations

import html
from typing import Any

from fleetwise.spec.output import strict_json_dumps

POLL_INTERVAL_S = 1.0
"""How often the page refreshes the fleet state (seconds)."""
HISTORY_S = 300.0
"""How far back the per-backend charts reach (seconds of gateway time): the last five minutes."""
CHART_SERIES = (("observed_ttft_s", "TTFT", "ms", 1e3), ("observed_tpot_s", "TPOT", "ms", 1e3),
                ("queued", "queue", "requests", 1.0), ("kv_usage", "KV used", "%", 100.0))
"""Charted per backend: /admin/fleet field, title, unit and the scale from the field to the unit."""
CHART_W, CHART_H = 160, 36
"""Size of one chart in CSS pixels."""

_STYLE = """
body{font:13px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
header{background:#1d2330;color:#fff;padding:12px 24px;display:flex;gap:24px;align-items:baseline;flex-wrap:wrap}
header h1{font-size:18px;margin:0} header span{color:#c9cfdb}
main{padding:12px 24px}
table{border-collapse:collapse;width:100%;background:#fff;border:1px solid #e1e4ea}
td,th{padding:4px 8px;border-bottom:1px solid #eceef2;text-align:left;vertical-align:top}
th{background:#f0f2f6;font-weight:600} td.n{text-align:right;font-variant-numeric:tabular-nums}
.bar{display:inline-block;height:8px;background:#2a5bd7;vertical-align:middle;margin-right:6px}
.down td{color:#c62828} .recent{color:#555d6e;font-size:12px}
#reasons span{margin-right:14px}
h2{font-size:15px;margin:18px 0 6px}
.charts{display:grid;grid-template-columns:max-content repeat(4,max-content);gap:4px 18px;background:#fff;
border:1px solid #e1e4ea;padding:8px}
.chart{font-size:11px;color:#555d6e} .chart svg{display:block;background:#fafbfc;border:1px solid #eceef2}
.chart polyline{fill:none;stroke:#2a5bd7;stroke-width:1.2}
"""

CHART_JS = """
var CHARTS = (function () {
  "use strict";
  function value(b, d) {
    var v = b[d[0]];
    return (v === null || v === undefined || !isFinite(Number(v))) ? null : Number(v) * d[3];
  }
  function remember(hist, nowS, backends, series, windowS) {
    backends.forEach(function (b) {
      var h = hist[b.name] || (hist[b.name] = []);
      var sample = { t: Number(nowS), v: series.map(function (d) { return value(b, d); }) };
      if (h.length && h[h.length - 1].t >= sample.t) { h.pop(); }
      h.push(sample);
      while (h.length && h[0].t < sample.t - windowS) { h.shift(); }
    });
    return hist;
  }
  function line(samples, i, nowS, windowS, w, h) {
    var pts = samples.filter(function (s) { return s.v[i] !== null; });
    var top = 0;
    pts.forEach(function (s) { top = Math.max(top, s.v[i]); });
    var scale = top > 0 ? top * 1.1 : 1;
    var points = pts.map(function (s) {
      var x = w * (1 - (nowS - s.t) / windowS), y = h - h * s.v[i] / scale;
      return x.toFixed(1) + "," + y.toFixed(1);
    }).join(" ");
    return { points: points, top: top, last: pts.length ? pts[pts.length - 1].v[i] : null };
  }
  return { remember: remember, line: line };
})();
"""

_COLUMNS = ("backend", "pool / role", "state", "in flight", "queued", "running", "KV usage", "prefix hits",
            "TTFT", "TPOT", "scrape age", "selected", "recent selections (reason, score)")

_SCRIPT = """
(function () {
  "use strict";
  var POLL = %(poll)s, INTERVAL_MS = %(interval_ms)d;
  var SERIES = %(series)s, HISTORY_S = %(history_s)s, W = %(w)d, H = %(h)d;
  var history = {};
  var SVG = "http://www.w3.org/2000/svg";
  function fmt(x) { return x === null ? "-" : (x >= 100 ? x.toFixed(0) : x.toPrecision(3)); }
  function chart(samples, i, nowS) {
    var d = SERIES[i], ln = CHARTS.line(samples, i, nowS, HISTORY_S, W, H);
    var box = document.createElement("div");
    box.className = "chart";
    var svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("width", W); svg.setAttribute("height", H); svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    var pl = document.createElementNS(SVG, "polyline");
    pl.setAttribute("points", ln.points);
    svg.appendChild(pl);
    var label = document.createElement("div");
    label.textContent = d[1] + " (" + d[2] + "): now " + fmt(ln.last) + ", top " + fmt(ln.top);
    box.appendChild(label);
    box.appendChild(svg);
    return box;
  }
  function charts(s) {
    var backends = (s.backends || []).concat(s.draining || []);
    CHARTS.remember(history, s.now_s, backends, SERIES, HISTORY_S);
    var grid = $("charts");
    grid.textContent = "";
    backends.forEach(function (b) {
      var name = document.createElement("div");
      name.textContent = b.name;
      grid.appendChild(name);
      for (var i = 0; i < SERIES.length; i++) { grid.appendChild(chart(history[b.name], i, Number(s.now_s))); }
    });
  }
  var token = new URLSearchParams(window.location.search).get("token");
  function $(id) { return document.getElementById(id); }
  function ms(x) { return (x === null || x === undefined) ? "-" : (x * 1000).toFixed(x < 0.1 ? 1 : 0) + " ms"; }
  function pct(x) { return (x === null || x === undefined) ? "-" : (x * 100).toFixed(1) + "%%"; }
  function num(x) { return (x === null || x === undefined) ? "-" : String(x); }
  function cell(tr, text, cls) {
    var td = document.createElement("td");
    td.textContent = text;
    if (cls) { td.className = cls; }
    tr.appendChild(td);
    return td;
  }
  function render(s) {
    $("policy").textContent = "policy " + (s.policy || "-");
    var sm = s.safe_mode || {};
    $("safe").textContent = "safe mode " + (sm.active ? "ACTIVE" : "off");
    $("decisions").textContent = num(s.decisions) + " decisions";
    $("now").textContent = "gateway time " + num(s.now_s) + " s";
    var reasons = $("reasons");
    reasons.textContent = "";
    var by = s.by_reason || {};
    Object.keys(by).sort().forEach(function (k) {
      var sp = document.createElement("span");
      sp.textContent = k + ": " + by[k];
      reasons.appendChild(sp);
    });
    var body = $("rows");
    body.textContent = "";
    (s.backends || []).concat(s.draining || []).forEach(function (b) {
      var tr = document.createElement("tr");
      tr.dataset.backend = b.name;
      if (!b.available) { tr.className = "down"; }
      cell(tr, b.name);
      cell(tr, (b.pool || "-") + " / " + (b.role || "-"));
      cell(tr, (b.healthy ? "healthy" : "unhealthy") + ", breaker " + (b.breaker || "-"));
      cell(tr, num(b.in_flight), "n");
      cell(tr, num(b.queued), "n");
      cell(tr, num(b.running), "n");
      var kv = cell(tr, "", "n");
      var bar = document.createElement("span");
      bar.className = "bar";
      bar.style.width = Math.round(60 * Math.min(1, Math.max(0, b.kv_usage || 0))) + "px";
      kv.appendChild(bar);
      kv.appendChild(document.createTextNode(pct(b.kv_usage)));
      cell(tr, pct(b.prefix_hit_rate), "n");
      cell(tr, ms(b.observed_ttft_s), "n");
      cell(tr, ms(b.observed_tpot_s), "n");
      cell(tr, b.scrape_age_s === null || b.scrape_age_s === undefined ? "never" : b.scrape_age_s.toFixed(1) + " s", "n");
      cell(tr, num(b.selected), "n");
      cell(tr, (b.recent || []).slice(-3).map(function (d) {
        return d.reason + (d.score === null || d.score === undefined ? "" : " (" + Number(d.score).toFixed(3) + ")");
      }).join("; "), "recent");
      body.appendChild(tr);
    });
    charts(s);
  }
  function poll() {
    var headers = token ? { "Authorization": "Bearer " + token } : {};
    fetch(POLL, { headers: headers, cache: "no-store" }).then(function (r) {
      if (!r.ok) { $("status").textContent = "fleet state: HTTP " + r.status; return null; }
      return r.json();
    }).then(function (s) {
      if (s) { render(s); $("status").textContent = "live, every " + (INTERVAL_MS / 1000) + " s"; }
    }, function () { $("status").textContent = "gateway unreachable, retrying"; });
  }
  render(JSON.parse($("fleet-state").textContent));
  window.setInterval(poll, INTERVAL_MS);
})();
"""


def _json_for_script(doc: Any) -> str:
    """JSON safe inside a <script> element (no `</script>` or `<!--` can appear)."""
    text = strict_json_dumps(doc, indent=None, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_dashboard(fleet: dict[str, Any], poll_path: str = "/admin/fleet",
                     interval_s: float = POLL_INTERVAL_S) -> str:
    """The live page for fleet state `fleet` (the /admin/fleet document), polling `poll_path`."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in _COLUMNS)
    script = CHART_JS + _SCRIPT % {"poll": _json_for_script(poll_path), "interval_ms": round(interval_s * 1000),
                                   "series": _json_for_script([list(c) for c in CHART_SERIES]),
                                   "history_s": _json_for_script(HISTORY_S), "w": CHART_W, "h": CHART_H}
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>fleetwise fleet</title><style>{_STYLE}</style></head><body>"
        '<header><h1>fleetwise fleet</h1><span id="policy"></span><span id="safe"></span>'
        '<span id="decisions"></span><span id="now"></span><span id="status">snapshot</span></header>'
        f'<main><p id="reasons"></p><table><thead><tr>{head}</tr></thead><tbody id="rows"></tbody></table>'
        f"<h2>last {HISTORY_S / 60:g} minutes (while this page is open)</h2>"
        '<div class="charts" id="charts"></div></main>'
        f'<script type="application/json" id="fleet-state">{_json_for_script(fleet)}</script>'
        f"<script>{script}</script></body></html>\n"
    )
