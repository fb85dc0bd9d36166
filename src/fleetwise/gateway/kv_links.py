"""The gateway's view of its KV links: what a decode backend's transfers have measured, decayed.

Owns turning the KV-transfer figures a decode backend exports (vLLM's NIXL connector metrics:
`vllm:nixl_xfer_time_seconds` and `vllm:nixl_bytes_transferred`, both observed on the decode
side) into a bandwidth estimate per decode backend, and that estimate's decay once it is stale:
between two scrapes, bytes moved over seconds spent moving them is the bandwidth its transfers
got (sharing and faults included); with no new transfer the estimate relaxes towards the best
fresh estimate of the fleet with half-life `LINK_HALF_LIFE_S`, so a link that was slow once is
tried again later. A prefill->decode pair is seen at its decode backend's estimate (vLLM reports
transfers on the decode side only).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LINK_HALF_LIFE_S", "LinkEstimate"]

LINK_HALF_LIFE_S = 30.0
"""Seconds after which a bandwidth estimate with no new transfer counts half (a link's figures
fade back to the fleet's best over about a minute and a half: three half-lives)."""


@dataclass(slots=True)
class LinkEstimate:
    """One decode backend's measured KV-transfer bandwidth and when it was last measured."""

    bytes_per_s: float | None = None
    measured_at_s: float = 0.0
    _xfer_s: float = 0.0
    _count: float = 0.0
    _bytes: float = 0.0

    def scraped(self, xfer_s_total: float, count: float, bytes_total: float, now_s: float) -> None:
        """Fold one scrape's cumulative transfer totals in (a counter reset starts afresh)."""
        if count < self._count or xfer_s_total < self._xfer_s or bytes_total < self._bytes:
            self._xfer_s = self._count = self._bytes = 0.0
        ds, dn, db = xfer_s_total - self._xfer_s, count - self._count, bytes_total - self._bytes
        self._xfer_s, self._count, self._bytes = xfer_s_total, count, bytes_total
        if dn > 0 and ds > 0 and db > 0:
            self.bytes_per_s, self.measured_at_s = db / ds, now_s

    def weight(self, now_s: float) -> float:
        """How much the estimate still counts at `now_s` (1 when just measured, 0 without one)."""
        if self.bytes_per_s is None:
            return 0.0
        return float(0.5 ** (max(0.0, now_s - self.measured_at_s) / LINK_HALF_LIFE_S))

    def at(self, now_s: float, reference_bytes_per_s: float) -> float:
        """The estimate at `now_s`, relaxed towards `reference_bytes_per_s` as it ages."""
        w = self.weight(now_s)
        if self.bytes_per_s is None or w <= 0:
            return reference_bytes_per_s
        return w * self.bytes_per_s + (1 - w) * reference_bytes_per_s
