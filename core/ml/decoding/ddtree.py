"""DDTree draft trees from one DFlash block (docs/evaluation.md §3), pure-Python builder.

The drafter's B-1 output positions give independent per-depth distributions. DDTree keeps the
``budget`` highest-scoring prefix-closed paths, scoring a path (t_1..t_m) by the surrogate
``sum_d log p_d(t_d)``, with a best-first search over a max-heap:

* start with candidate (depth 1, rank 0, parent = root);
* pop the best candidate, append it as a node; push its next sibling (same parent and depth,
  next rank: score - logp(rank) + logp(rank+1)) and its first child (depth+1, rank 0:
  score + logp_{d+1}(top1));
* stop after ``budget`` nodes. Both moves never increase the score, so the popped nodes are
  the ``budget`` best paths; ties break on (depth, rank, insertion order).

Node 0 is the root (the block's first token, already known); drafted nodes are 1..budget, in
pop order, so ``parent < child`` always holds.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class DraftTree:
    """A verified-in-one-pass token tree.

    Attributes:
        tokens: token per node; ``tokens[0]`` is the root.
        parents: parent index per node (``-1`` for the root).
        depths: depth per node (root 0, drafted nodes 1..B-1).
        children: per node, ``token -> child index``.
    """

    tokens: list[int]
    parents: list[int]
    depths: list[int]
    children: list[dict[int, int]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, token: int, parent: int) -> int:
        """Append a node; returns its index."""
        idx = len(self.tokens)
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.children.append({})
        self.children[parent][int(token)] = idx
        return idx

    def follow(self, next_token: Sequence[int] | dict[int, int]) -> tuple[list[int], int]:
        """Walk from the root along the target's choices.

        Args:
            next_token: the target's token after each node (``next_token[i]`` = greedy/sampled
                token following node i's path).

        Returns:
            ``(accepted, bonus)``: accepted node indices starting with the root, and the target's
            token after the last accepted node (the bonus/correction token).
        """
        cur, accepted = 0, [0]
        nxt = int(next_token[0])
        while nxt in self.children[cur]:
            cur = self.children[cur][nxt]
            accepted.append(cur)
            nxt = int(next_token[cur])
        return accepted, nxt

    def deepest_match(self, labels: Sequence[int]) -> int:
        """Deepest d such that ``labels[0..d-1]`` is a root path (offline DDTree streak)."""
        cur, d = 0, 0
        for y in labels:
            child = self.children[cur].get(int(y))
            if child is None:
                break
            cur, d = child, d + 1
        return d


def build_tree(root_token: int, topk: Sequence[Sequence[tuple[float, int]]], budget: int) -> DraftTree:
    """Best-first DDTree construction.

    Args:
        root_token: the block's first token (node 0).
        topk: per depth d = 1..D, the candidates ``(logprob, token)`` sorted by logprob
            descending (at least ``min(budget, V)`` of them).
        budget: number of drafted nodes (root excluded). 0 gives a root-only tree.

    Returns:
        The tree with ``1 + min(budget, reachable)`` nodes.
    """
    tree = DraftTree(tokens=[int(root_token)], parents=[-1], depths=[0], children=[{}])
    depth_limit = len(topk)
    if budget <= 0 or depth_limit == 0 or not topk[0]:
        return tree
    counter = 0
    # heap entries: (-score, depth, rank, counter, parent, parent_score)
    heap = [(-topk[0][0][0], 1, 0, counter, 0, 0.0)]
    while heap and len(tree) - 1 < budget:
        neg, depth, rank, _, parent, parent_score = heapq.heappop(heap)
        score = -neg
        node = tree.add(topk[depth - 1][rank][1], parent)
        level = topk[depth - 1]
        if rank + 1 < len(level):  # next sibling
            counter += 1
            heapq.heappush(heap, (-(parent_score + level[rank + 1][0]), depth, rank + 1, counter, parent, parent_score))
        if depth < depth_limit and topk[depth]:  # first child
            counter += 1
            heapq.heappush(heap, (-(score + topk[depth][0][0]), depth + 1, 0, counter, node, score))
    return tree


def topk_per_depth(draft_logits, budget: int) -> list[list[tuple[float, int]]]:
    """Per-depth top-k ``(logprob, token)`` lists from draft logits [D, V] (torch tensor).

    ``k = min(budget, V)``; log-softmax in float32, no temperature.
    """
    import torch

    k = max(1, min(budget, draft_logits.shape[-1]))
    logp = torch.log_softmax(draft_logits.float(), dim=-1)
    vals, idx = torch.topk(logp, k, dim=-1)
    return [list(zip(v, i)) for v, i in zip(vals.tolist(), idx.tolist())]
