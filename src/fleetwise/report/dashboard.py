"""The live fleet page: one self-contained HTML document from a gateway's fleet state.

`render_dashboard(fleet)` takes the `GET /admin/fleet` document (see docs/gateway.md: policy,
safe mode, decisions by reason, and per backend its queue, running batch, KV usage, prefix hit
rate, observed TTFT/TPOT, scrape age and recent selections with reasons and scores) and
returns a page that shows it at once and then polls `poll_path` every `interval_s` with the
bearer token taken from the page's own `?token=` query. No external assets: style and script
are inline, values are written with `textContent` (never parsed as markup). Standard library
only, so a server can serve it without pulling in the report figures.
"""

from __future__ import annotations

import html
from typing import Any

from fleetwise.spec.inputs import strict_json_dumps

POLL_INTERVAL_S = 1.0
"""How often the page refreshes the fleet state (seconds)."""

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
"""

_COLUMNS = ("backend", "pool / role", "state", "in flight", "queued", "running", "KV usage", "prefix hits",
            "TTFT", "TPOT", "scrape age", "selected", "recent selections (reason, score)")

_SCRIPT = """
(function () {
  "use strict";
  var POLL = %(poll)s, INTERVAL_MS = %(interval_ms)d;
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
    script = _SCRIPT % {"poll": _json_for_script(poll_path), "interval_ms": round(interval_s * 1000)}
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>fleetwise fleet</title><style>{_STYLE}</style></head><body>"
        '<header><h1>fleetwise fleet</h1><span id="policy"></span><span id="safe"></span>'
        '<span id="decisions"></span><span id="now"></span><span id="status">snapshot</span></header>'
        f'<main><p id="reasons"></p><table><thead><tr>{head}</tr></thead><tbody id="rows"></tbody></table></main>'
        f'<script type="application/json" id="fleet-state">{_json_for_script(fleet)}</script>'
        f"<script>{script}</script></body></html>\n"
    )
