"""The bounds on what a user may ask for: document and body sizes, nesting, counts, durations and
factors; the one place the project bounds them (docs/errors.md lists each with its reason)."""

from __future__ import annotations

from fleetwise.errors import QUOTE_CHARS

MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
"""Largest spec-like document (plan, workload, faults, profile, ground truth): 16 MiB. The
largest shipped document is a few KiB; anything near this limit is not a hand-written spec."""
MAX_BODY_BYTES = 4 * 1024 * 1024
"""Largest HTTP request body a live server parses: 4 MiB, about a 1M-token prompt as text."""
MAX_NESTING_DEPTH = 64
"""Deepest nesting of lists/mappings in a document or body; specs nest fewer than 10 levels.
Bounded so a hostile document cannot exhaust the parser's stack."""
MAX_YAML_NODES = 200_000
"""Most YAML nodes a document may expand to, aliases counted at every use. Stops alias bombs
(a few hundred bytes that expand to billions of nodes) before anything is built."""
MAX_QUOTE_CHARS = QUOTE_CHARS
"""Longest quote of an offending value in an error message (the rest is elided; `quote`)."""
MAX_INT_DIGITS = 30
"""Longest integer literal accepted in a JSON body (beyond any count or id the project uses)."""

MAX_TCP_PORT = 65_535
"""Highest TCP port (16 bits, RFC 9293); a fleet on consecutive ports from P must end at or below it."""

MAX_LOCAL_REPLICAS = 64
"""Most replicas `fleetwise up` and `emulate --plan` start as local processes: each emulator
process is about 75 MB resident and a second or so of CPU to start (pure Python, the 2-core VM
of docs/simulator.md), so 64 is about 5 GB; a plan of 500 started 500 processes and loaded that
machine to 62 before its start timeout. A larger fleet is rehearsed scaled down."""

MAX_REPLICAS = 10_000
"""Most replicas in one plan (all pools). The simulator and the router keep per-replica state and
score every eligible replica per request; 10k replicas of 8 GPUs is 80k GPUs, beyond any
published single-model serving fleet."""
MAX_GPUS = 80_000
"""Most GPUs a plan search may use (`search.max_gpus`): MAX_REPLICAS replicas' worth of 8-GPU nodes."""
MAX_ENGINE_SEQS = 65_536
"""Most sequences one replica may run at once (vLLM's default is 256); per-sequence state is
kept for each, and no accelerator holds the KV of more."""
MAX_BLOCK_TOKENS = 1_024
"""Largest KV block in tokens (vLLM offers 8 to 256; larger blocks waste most of the last one)."""
MAX_REQUESTS = 10_000_000
"""Most requests one run generates or replays (`num_requests`, `--requests`, trace rows). A
request costs about 1 KiB across its input, record and result rows, so 10M is ~10 GiB."""
MAX_SEEDS = 1_000
"""Most seeds one command runs (`scenarios --seeds`, `search.seeds`): each seed is a full run,
and 1000 already puts a 95% interval within a few percent of its mean."""
MAX_SESSION_TURNS = 1_000
"""Most turns per multi-turn session (`mean_turns`, `max_turns`): each turn's prompt carries
every earlier turn, so 1000 turns outgrow any model's context long before the cap."""
MAX_TOKENS = 100_000_000
"""Most tokens one length field may state (prompt, output, prefix): 100M is 100x the longest
context of any catalog model; the model-aware check then applies the model's own context."""
MAX_DURATION_S = 366 * 24 * 3600.0
"""Longest virtual time a run may state (`duration_s`, fault times, think time): one year."""
MAX_RATE_RPS = 1_000_000.0
"""Highest arrival rate (requests/s): a million requests per second, 100x the busiest public trace."""
MAX_FACTOR = 1_000.0
"""Largest slowdown or time-scale factor: beyond it a run is dominated by one term."""
MIN_FACTOR = 1e-3
"""Smallest slowdown or time-scale factor (a factor of 1e-300 would make a step free)."""
