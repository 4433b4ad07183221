"""Acceptance metrics (CONTRACT.md "Metric definitions").

A window is one verify pass of the target over [last id, proposals...]; kept counts the rows it
kept, the bonus included (1 <= kept <= proposed + 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Tally:
    proposed: list[int] = field(default_factory=list)     # per window: how many ids were proposed
    kept: list[int] = field(default_factory=list)         # per window: rows kept (bonus included)
    draft_s: float = 0.0
    verify_s: float = 0.0
    commit_s: float = 0.0
    transfer_s: float = 0.0           # a draft on its own device: the taps' crossing (out of commit_s)
    transfer_bytes: int = 0
    transfer_windows: int = 0

    def add(self, proposed: int, kept: int) -> None:
        if not 1 <= kept <= proposed + 1:
            raise ValueError(f"kept {kept} outside 1..{proposed + 1}")
        self.proposed.append(proposed)
        self.kept.append(kept)

    def merge(self, other: Tally) -> Tally:
        return Tally(self.proposed + other.proposed, self.kept + other.kept, self.draft_s + other.draft_s,
                     self.verify_s + other.verify_s, self.commit_s + other.commit_s, self.transfer_s + other.transfer_s,
                     self.transfer_bytes + other.transfer_bytes, self.transfer_windows + other.transfer_windows)

    @property
    def windows(self) -> int:
        return len(self.kept)

    @property
    def proposals(self) -> int:
        return sum(self.proposed)

    @property
    def accepts(self) -> int:
        """Proposals that were kept (the bonus row is not a proposal)."""
        return sum(k - 1 for k in self.kept)

    @property
    def accept_mean(self) -> float:
        """E = mean kept per window (vLLM's mean acceptance length, SGLang's accept length, #MAT)."""
        return sum(self.kept) / self.windows if self.windows else 0.0

    def histogram(self) -> list[int]:
        """kept=[h1, h2, ...]: index 0 counts windows that kept 1 row."""
        top = max(self.kept, default=1)
        return [sum(1 for k in self.kept if k == i + 1) for i in range(top)]

    def pos_accept(self) -> list[float]:
        """[i] = P(first i+1 proposals all accepted) over windows that proposed more than i ids."""
        width = max(self.proposed, default=0)
        out = []
        for i in range(width):
            asked = [k for p, k in zip(self.proposed, self.kept, strict=True) if p > i]
            out.append(sum(1 for k in asked if k > i + 1) / len(asked) if asked else 0.0)
        return out

    def pos_accept_cond(self) -> list[float]:
        """[i] = the same over windows whose first i proposals were kept (kept > i)."""
        width = max(self.proposed, default=0)
        out = []
        for i in range(width):
            reached = [k for p, k in zip(self.proposed, self.kept, strict=True) if p > i and k > i]
            out.append(sum(1 for k in reached if k > i + 1) / len(reached) if reached else 0.0)
        return out

    @property
    def draft_share(self) -> float:
        """draft / (draft + verify + commit + transfer): the crossing is step time, not the draft's."""
        total = self.draft_s + self.verify_s + self.commit_s + self.transfer_s
        return self.draft_s / total if total > 0 else 0.0

    @property
    def transfer_share(self) -> float:
        total = self.draft_s + self.verify_s + self.commit_s + self.transfer_s
        return self.transfer_s / total if total > 0 else 0.0


def macro_accept_mean(per_prompt: list[Tally]) -> float:
    """Mean over prompts of per-prompt accept_mean (z-lab's tau)."""
    used = [t.accept_mean for t in per_prompt if t.windows]
    return sum(used) / len(used) if used else 0.0
