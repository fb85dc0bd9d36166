"""L5: the planner, one module per phase its explanation names, filling one `state.Search`.

`api.plan` runs fit (`fit`) -> latency floors (`latency`) -> effective goodput (`goodput`, with
load tests from `loadtest`) -> sizing (`sizing`) -> refinement (`refinement`) -> headroom terms
and claims of the plans that can still be reported (`checks`) -> disaggregation and claims
(`disaggregation`) -> ranking (`ranking`); `simulate` turns fleet shapes into judged
simulator runs (`early` stops a run whose pass or fail is already certain), `workload` the spec's traffic into request mixes, `executor` fans tasks out,
`report` renders the result. `layout` holds the vocabulary every phase speaks (`Layout`,
`Hardware`, `Rejection`) and `results` the records the phases leave in the state; both sit below
the phases, which import each other only downward.
"""
