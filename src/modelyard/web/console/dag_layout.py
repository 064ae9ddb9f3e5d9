"""A layered layout of a directed acyclic graph, for the console's pipeline graphs (no script from a CDN:
the console runs offline, so the layout is ours, computed on the server and drawn as SVG).

Sugiyama's scheme, kept small: each node's layer is its longest path from a source (edges point down);
nodes within a layer are ordered by the mean position of their neighbours (a few sweeps down and up,
which undoes most crossings of a pipeline's fan-outs and fan-ins); a layer wider than ``max_row`` nodes
wraps onto further rows (a 100-task fan-out stays readable). Coordinates are the nodes' top-left
corners in pixels.
"""
from __future__ import annotations

from dataclasses import dataclass

NODE_W, NODE_H = 170, 46
H_GAP, V_GAP = 24, 40
MARGIN = 12


@dataclass(frozen=True)
class Layout:
    """Each node's top-left corner, and the drawing's size."""
    positions: dict[str, tuple[int, int]]
    width: int
    height: int


def _neighbours(nodes: list[str], edges: list[tuple[str, str]]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Each node's predecessors and successors; edges naming unknown nodes, and self-loops, are ignored."""
    preds: dict[str, list[str]] = {n: [] for n in nodes}
    succs: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in edges:
        if a in preds and b in preds and a != b:
            preds[b].append(a)
            succs[a].append(b)
    return preds, succs


def layers(nodes: list[str], edges: list[tuple[str, str]]) -> dict[str, int]:
    """Each node's layer: 0 for a node with no predecessor, else one more than its deepest predecessor.
    Edges naming unknown nodes are ignored; a cycle (never in a compiled pipeline) leaves its nodes on
    the layer reached so far rather than looping."""
    preds, succs = _neighbours(nodes, edges)
    waiting = {n: len(preds[n]) for n in nodes}
    layer = {n: 0 for n in nodes}
    ready = [n for n in nodes if waiting[n] == 0]
    while ready:
        n = ready.pop(0)
        for s in succs[n]:
            layer[s] = max(layer[s], layer[n] + 1)
            waiting[s] -= 1
            if waiting[s] == 0:
                ready.append(s)
    return layer


def _ordered(rows: list[list[str]], preds: dict[str, list[str]], succs: dict[str, list[str]],
             sweeps: int = 2) -> list[list[str]]:
    """Rows reordered by the barycentre of each node's neighbours in the row above (then below)."""
    rows = [list(r) for r in rows]
    for _ in range(sweeps):
        for direction, neighbours in ((range(1, len(rows)), preds), (range(len(rows) - 2, -1, -1), succs)):
            for i in direction:
                where = {n: k for r in rows for k, n in enumerate(r)}

                def key(item: tuple[int, str], neighbours=neighbours, where=where) -> float:
                    k, n = item
                    near = [where[m] for m in neighbours[n] if m in where]
                    return sum(near) / len(near) if near else k
                rows[i] = [n for _, n in sorted(enumerate(rows[i]), key=key)]
    return rows


def layout(nodes: list[str], edges: list[tuple[str, str]], max_row: int = 5) -> Layout:
    """Positions for ``nodes`` (in the order given, where nothing else decides) with ``edges`` pointing down."""
    if not nodes:
        return Layout({}, 2 * MARGIN, 2 * MARGIN)
    layer = layers(nodes, edges)
    preds, succs = _neighbours(nodes, edges)
    by_layer: list[list[str]] = [[] for _ in range(max(layer.values()) + 1)]
    for n in nodes:
        by_layer[layer[n]].append(n)
    ordered = _ordered(by_layer, preds, succs)
    rows = [r[i:i + max_row] for r in ordered for i in range(0, len(r), max_row)]
    widest = max(len(r) for r in rows)
    width = widest * NODE_W + (widest - 1) * H_GAP + 2 * MARGIN
    positions = {}
    for y, row in enumerate(rows):
        row_width = len(row) * NODE_W + (len(row) - 1) * H_GAP
        left = MARGIN + (width - 2 * MARGIN - row_width) // 2  # each row centred under the widest
        for x, n in enumerate(row):
            positions[n] = (left + x * (NODE_W + H_GAP), MARGIN + y * (NODE_H + V_GAP))
    height = len(rows) * NODE_H + (len(rows) - 1) * V_GAP + 2 * MARGIN
    return Layout(positions, width, height)


def edge_path(src: tuple[int, int], dst: tuple[int, int]) -> str:
    """An SVG path from the bottom middle of the node at ``src`` to the top middle of the one at ``dst``."""
    x1, y1 = src[0] + NODE_W // 2, src[1] + NODE_H
    x2, y2 = dst[0] + NODE_W // 2, dst[1]
    bend = max(V_GAP // 2, (y2 - y1) // 2)
    return f"M{x1},{y1} C{x1},{y1 + bend} {x2},{y2 - bend} {x2},{y2}"
