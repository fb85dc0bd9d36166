"""Phase 1, fit: resolve the hardware and enumerate replica layouts that fit.

Owns the accelerator overrides of the spec (price, node shape, links), the enumeration of
layouts (`planner.layout.Layout`) with the fit check of each and the reason a layout is dropped, and `prepare` (the spec into the `Search` state: request mix, burst factor, perf model).
TP stays inside a node (`tp_candidates`); PP is only tried once TP fills the node (splitting a
model across nodes before using the node's fast link only adds hops); for MoE models EP spans the
replica's GPUs when the expert count allows it. Does not time anything.
"""

from __future__ import annotations

from fleetwise.errors import InfeasibleError, SpecError
from fleetwise.perf.memory import FitOptions, LayoutFit, layout_fit, tp_candidates
from fleetwise.perf.profile import Profile
from fleetwise.perf.roofline import PerfModel
from fleetwise.planner.layout import Enumeration, Hardware, Layout, Rejection
from fleetwise.planner.simulate import MAX_REQUESTS_PER_RUN
from fleetwise.planner.state import Context, Search
from fleetwise.planner.workload import build_mix, burst_factor
from fleetwise.spec.catalog import GPUS, resolve_gpu, resolve_model
from fleetwise.spec.dtypes import COMPUTE_DTYPE_FOR_WEIGHTS
from fleetwise.spec.hardware import AcceleratorSpec
from fleetwise.spec.planning import SAMPLE_REQUESTS_MIN, AcceleratorChoice, PlanningSpec

GB = 1e9


def _apply_overrides(gpu: AcceleratorSpec, choice: AcceleratorChoice) -> AcceleratorSpec:
    update: dict[str, object] = {}
    if choice.price_per_hour_usd is not None:
        update["price_per_hour_usd"] = choice.price_per_hour_usd
    if choice.gpus_per_node is not None:
        update["gpus_per_node"] = choice.gpus_per_node
    if choice.intra_node_bytes_per_s is not None:
        update["intra_node_link"] = gpu.intra_node_link.model_copy(
            update={"bandwidth_bytes_per_s": choice.intra_node_bytes_per_s})
    if choice.network_bytes_per_s is not None:
        update["network"] = gpu.network.model_copy(update={"bandwidth_bytes_per_s": choice.network_bytes_per_s})
    return gpu.model_copy(update=update) if update else gpu


def resolve_hardware(spec: PlanningSpec, context_tokens: int) -> Hardware:
    """Resolve model and accelerators (SpecError names the field on an unknown name)."""
    model = resolve_model(spec.model)
    gpus: dict[str, AcceleratorSpec] = {}
    caps: dict[str, int] = {}
    for choice in spec.accelerators:
        gpu = _apply_overrides(resolve_gpu(choice.name), choice)
        # A card from a file is known by its path, as the simulator and the fleet document resolve it.
        key = gpu.name if choice.name.strip().lower() in GPUS else choice.name
        gpus[key] = gpu
        caps[key] = min(spec.search.max_gpus, choice.max_gpus or spec.search.max_gpus)
    ctx = max(1, min(context_tokens, model.max_context_tokens))
    return Hardware(model, gpus, caps, ctx, FitOptions(context_tokens=ctx), spec.moe.expert_imbalance,
                    expert_load=spec.moe.expert_load)


def _layouts_for(hw: Hardware, name: str, dtype: str, max_pp: int) -> list[Layout]:
    gpu, model = hw.gpus[name], hw.model
    tps = tp_candidates(model, gpu)
    out: list[Layout] = []
    for tp in tps:
        for pp in (1, 2, 4, 8, 16):
            if pp > max_pp or pp > model.num_layers or tp * pp > hw.max_gpus[name]:
                continue
            if pp > 1 and tp != max(tps):
                continue
            ep = 1
            if model.moe is not None and tp * pp > 1 and model.moe.num_experts % (tp * pp) == 0:
                ep = tp * pp
            out.append(Layout(name, dtype, tp, pp, ep))
    return out


def _reject_reason(f: LayoutFit, ctx: int) -> str:
    return (f"does not fit: per card {f.weight_bytes / GB:.1f} GB weights + {f.activation_bytes / GB:.1f} GB "
            f"activations + {f.reserve_bytes / GB:.1f} GB reserve of {f.usable_bytes / GB:.1f} GB usable leaves "
            f"KV for {max(0, f.kv_capacity_tokens):,} tokens; one request needs {f.request_tokens or ctx:,.0f}")


def enumerate_layouts(hw: Hardware, spec: PlanningSpec) -> Enumeration:
    """Every accelerator x precision x TP/PP/EP layout, split into fitting and rejected (maybe none fit).

    Only the smallest fitting layout per (accelerator, precision) and the layouts up to a full
    node of TP above it are kept: a larger PP than needed to fit only adds pipeline bubbles.
    """
    fitting: list[tuple[Layout, LayoutFit]] = []
    rejected: list[Rejection] = []
    for name in hw.gpus:
        for dtype in spec.weight_dtypes:
            found_pp: int | None = None
            for lay in _layouts_for(hw, name, dtype, spec.search.max_pp):
                f = layout_fit(hw.model, hw.gpus[name], lay.parallelism, dtype, spec.kv_dtype, hw.fit_options)
                if not f.fits:
                    rejected.append(Rejection(lay.label, _reject_reason(f, hw.context_tokens)))
                elif found_pp is None or lay.pp <= found_pp:
                    found_pp = lay.pp if found_pp is None else found_pp
                    fitting.append((lay, f))
    return Enumeration(fitting, rejected)


def nothing_fits(hw: Hardware, spec: PlanningSpec) -> InfeasibleError:
    """The explanation when no layout of any allowed card holds the model."""
    return InfeasibleError(_nothing_fits_text(hw, spec))


def _nothing_fits_text(hw: Hardware, spec: PlanningSpec) -> str:
    m = hw.model
    smallest = min(spec.weight_dtypes, key=lambda d: m.weight_bytes(d))
    w = m.weight_bytes(smallest)
    have = ", ".join(f"{n}: {hw.max_gpus[n]} x {g.hbm_bytes / GB:.0f} GB" for n, g in hw.gpus.items())
    return (f"no allowed hardware holds {m.name}: its weights alone are {w / GB:.0f} GB at {smallest} "
            f"(plus KV for a {hw.context_tokens:,}-token request) and the largest replica allowed is "
            f"({have}) with TP inside a node and PP <= {spec.search.max_pp}; "
            "raise search.max_gpus or search.max_pp, allow fp8/int4 weights, or add a larger card")


def _check_sample(spec: PlanningSpec, rows: int) -> None:
    """SpecError when a trace gives fewer requests than one simulation run replays: every rate then
    replays those few, and the bisection of a replica's goodput climbs to its cap."""
    need = spec.search.sample_requests
    if rows < need:
        a = spec.workload.arrival
        fix = (f"lower search.sample_requests to {rows} or give a longer trace" if rows >= SAMPLE_REQUESTS_MIN
               else f"give a trace of at least {SAMPLE_REQUESTS_MIN} requests")
        raise SpecError(f"workload.arrival.path={getattr(a, 'path', '?')}: {rows} requests to replay, fewer than the "
                        f"search.sample_requests={need} each simulation run replays; {fix}")


def prepare(spec: PlanningSpec) -> Search:
    """The state every later phase fills: request mix, burst factor, hardware, perf model, layouts."""
    n = MAX_REQUESTS_PER_RUN + 500
    mix = build_mix(spec.workload, n, seed=0, max_context_tokens=resolve_model(spec.model).max_context_tokens)
    _check_sample(spec, len(mix.prompt))
    stats = mix.stats
    hw = resolve_hardware(spec, stats.prompt_max + stats.output_max)
    if spec.headroom.burst_factor is not None:
        burst, src = spec.headroom.burst_factor, "given in the spec"
    else:
        burst = burst_factor(mix, spec.workload.rate_rps, spec.headroom.burst_window_s)
        src = f"p99 over mean arrivals per {spec.headroom.burst_window_s:g} s window of the workload"
    profile = Profile.load(spec.profile) if spec.profile else None
    ctx = Context(spec, mix, {n: hw.price(n) for n in hw.gpus}, burst,
                  {d: hw.model.weight_bytes(d) for d in spec.weight_dtypes},
                  {n: g.storage_bytes_per_s for n, g in hw.gpus.items()})
    search = Search(spec, hw, stats, burst, src, PerfModel(profile), ctx)
    search.enumeration = enumerate_layouts(hw, spec)
    search.rejected.extend(search.enumeration.rejected)
    return search


def fit_line(hw: Hardware, lay: Layout, fit: LayoutFit, kv_dtype: str) -> str:
    """The explanation's fit step for one layout."""
    m = hw.model
    line = (f"fit: {m.name} ({m.params_total / 1e9:.1f}B params, {m.weight_bytes(lay.weight_dtype) / 1e9:.0f} GB at "
            f"{lay.weight_dtype}) on {lay.label}: {fit.weight_bytes / 1e9:.1f} GB weights per card, "
            f"KV ({kv_dtype}) for {fit.kv_capacity_tokens:,} tokens per replica")
    if m.num_window_layers:
        line += (f"; sliding window: {m.num_window_layers} of {m.num_layers} layers keep at most "
                 f"{m.sliding_window:,} tokens, so a {fit.context_tokens:,}-token request needs "
                 f"{fit.request_tokens:,.0f} of them")
    compute = COMPUTE_DTYPE_FOR_WEIGHTS.get(lay.weight_dtype, "bf16")
    if compute not in hw.gpus[lay.accelerator].flops_per_s:
        line += (f"; {lay.accelerator} lists no {compute} tensor peak: the {lay.weight_dtype} weights are read at "
                 f"{lay.weight_dtype} size and computed at its bf16 rate (weight-only, as on cards without it)")
    if m.moe is not None:
        line += (f"; MoE: memory follows total params ({m.params_total / 1e9:.0f}B), compute follows active "
                 f"({m.params_active / 1e9:.1f}B, 1/{m.params_total / m.params_active:.1f})")
    return line
