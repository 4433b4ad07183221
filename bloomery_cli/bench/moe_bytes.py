"""What a pass of an MoE target reads: weight bytes over the active experts only, and the distinct experts R rows
touch (the MoE bench's counting; CPU-tested on the tiny shapes).

Tensors as the engine holds them (name -> tensor, run dtype or float32 routers), split into
  expert   ``*.mlp.experts.gate_up_proj`` [E, 2F, H] and ``*.mlp.experts.down_proj`` [E, H, F] of each MoE layer l:
           one expert's bytes b_l = (|gate_up_l| + |down_l|) / E
  head     the LM head [V, H], read whole by every pass
  embed    the embedding [V, H]: a pass of R rows reads R rows of it
  dense    everything else (attention / DeltaNet, norms, routers, shared experts, dense MLPs): read whole

A pass of R rows whose rows touch d_l distinct experts in MoE layer l reads

    bytes(R, d) = dense + head + R * embed_row + sum_l d_l * b_l                 (every weight once, no cache)

A plain step is R = 1, d_l = k (top-k). Distinct experts of R rows, k chosen per row among E:
    worst case (every row its own set)        d = min(E, R k)
    independent uniform rows (balanced load)  E[d] = E (1 - (1 - k/E)^R)
The engine's gather-based experts (``kernels.ops.moe.routed_experts``) read one expert's matrices per (row, slot)
pair whether or not another row chose it: R k b_l a layer (``gathered``), the distinct count's upper bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

T = torch.Tensor


def _nbytes(x: T) -> int:
    return x.numel() * x.element_size()


@dataclass(frozen=True)
class MoEBytes:
    """A target's weight bytes by kind; ``expert[l]`` one expert's bytes in MoE layer l (model layer index)."""

    dense: int
    head: int
    embed_row: int
    expert: dict[int, int]
    top_k: int
    experts: int

    def plain(self) -> int:
        """Bytes one plain step (one row, k experts a MoE layer) reads."""
        return self.dense + self.head + self.embed_row + self.top_k * sum(self.expert.values())

    def pass_bytes(self, rows: int, distinct: Mapping[int, int]) -> int:
        """Bytes a pass of ``rows`` rows reads when MoE layer l's rows touch ``distinct[l]`` experts."""
        if set(distinct) != set(self.expert):
            raise ValueError(f"distinct counts for layers {sorted(distinct)}, MoE layers are {sorted(self.expert)}")
        return self.dense + self.head + rows * self.embed_row + sum(d * self.expert[l] for l, d in distinct.items())

    def gathered(self, rows: int) -> int:
        """Expert bytes the gather-based engine reads for ``rows`` rows: R k matrices a MoE layer."""
        return rows * self.top_k * sum(self.expert.values())

    def all_experts(self) -> int:
        return self.experts * sum(self.expert.values())

    def scaled(self, moe_layers: int, layers: int, run_layers: int) -> MoEBytes:
        """The same per-layer bytes at another depth (``moe_layers`` MoE layers, ``layers`` in all): the mean
        MoE layer's expert bytes repeated, the trunk's dense bytes per layer scaled by layers / run_layers."""
        mean = sum(self.expert.values()) // max(1, len(self.expert))
        per_layer_dense = (self.dense) / max(1, run_layers)
        return MoEBytes(int(per_layer_dense * layers), self.head, self.embed_row,
                        {l: mean for l in range(moe_layers)}, self.top_k, self.experts)


def moe_bytes(tensors: Mapping[str, T], head: T, embed: T, top_k: int, experts: int) -> MoEBytes:
    """Split the engine's layer tensors (``model.layers.*``; draft ``mtp.*`` tensors excluded) into dense and
    per-layer expert bytes; the head and the embedding given apart (as the engines hold them)."""
    dense, expert = 0, {}
    for name, x in tensors.items():
        if not name.startswith("model.layers."):
            continue
        if ".mlp.experts.gate_up_proj" in name or ".mlp.experts.down_proj" in name:
            if x.shape[0] != experts:
                raise ValueError(f"{name}: {x.shape[0]} experts, expected {experts}")
            layer = int(name.split(".")[2])
            expert[layer] = expert.get(layer, 0) + _nbytes(x) // experts
        else:
            dense += _nbytes(x)
    return MoEBytes(dense, _nbytes(head), _nbytes(embed[0]), expert, top_k, experts)


def distinct_worst(experts: int, top_k: int, rows: int) -> int:
    return min(experts, rows * top_k)


def distinct_uniform(experts: int, top_k: int, rows: int) -> float:
    """Expected distinct experts of ``rows`` independent rows, each k distinct experts uniformly among E."""
    return experts * (1.0 - (1.0 - top_k / experts) ** rows)


def distinct_of(ids: T) -> int:
    """Distinct experts in a routing's ids [R, k]."""
    return int(torch.unique(ids).numel())


def disjoint_ids(rows: int, top_k: int, experts: int, device: torch.device | str = "cpu") -> T:
    """The worst case's routing ids [R, k]: row r slot j -> expert (r k + j) mod E (disjoint sets while R k <= E)."""
    return (torch.arange(rows * top_k, device=device) % experts).view(rows, top_k)


def load_spread(ids: T, experts: int) -> dict[str, float]:
    """How evenly the picks in ids [N, k] spread over E experts: max and min share over the mean share, and the
    normalised entropy of the shares (1 = perfectly even)."""
    counts = torch.bincount(ids.reshape(-1).cpu(), minlength=experts).double()
    share = counts / counts.sum()
    nz = share[share > 0]
    entropy = float(-(nz * nz.log()).sum() / torch.log(torch.tensor(float(experts), dtype=torch.float64)))
    mean = 1.0 / experts
    return {"max_over_mean": float(share.max()) / mean, "min_over_mean": float(share.min()) / mean,
            "entropy": entropy, "picks": int(counts.sum())}
