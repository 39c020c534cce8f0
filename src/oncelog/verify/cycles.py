"""Cycles in a dependency graph between transactions (pure, iterative: no recursion limit).

``strongly_connected`` is Tarjan's algorithm, O(V + E); ``shortest_cycle`` finds, inside one strongly
connected component, a shortest cycle through a given node by breadth-first search, O(V + E) of the
component. Nodes are any hashable values; the graph is ``{node: set of successors}``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Mapping
from typing import TypeVar

N = TypeVar("N", bound=Hashable)


def strongly_connected(graph: Mapping[N, Iterable[N]]) -> list[list[N]]:
    """The strongly connected components with more than one node (a node's self-loop is ignored)."""
    index: dict[N, int] = {}
    low: dict[N, int] = {}
    on_stack: set[N] = set()
    stack: list[N] = []
    found: list[list[N]] = []
    counter = 0
    nodes = set(graph)
    for succs in graph.values():
        nodes.update(succs)
    for root in nodes:
        if root in index:
            continue
        # Each frame: (node, iterator over its successors).
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(graph.get(root, ())))]
        while work:
            node, succs = work[-1]
            advanced = False
            for succ in succs:
                if succ not in index:
                    index[succ] = low[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(graph.get(succ, ()))))
                    advanced = True
                    break
                if succ in on_stack and index[succ] < low[node]:
                    low[node] = index[succ]
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                if low[node] < low[parent]:
                    low[parent] = low[node]
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def shortest_cycle(graph: Mapping[N, Iterable[N]], component: Iterable[N], start: N) -> list[N]:
    """A shortest cycle through ``start`` using only nodes of ``component``, as [start, ..., start]
    (empty if there is none)."""
    members = set(component)
    parent: dict[N, N] = {}
    queue = deque([start])
    seen = {start}
    while queue:
        node = queue.popleft()
        for succ in graph.get(node, ()):
            if succ not in members:
                continue
            if succ == start:
                path = [node]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                path.reverse()
                return [*path, start]
            if succ not in seen:
                seen.add(succ)
                parent[succ] = node
                queue.append(succ)
    return []
