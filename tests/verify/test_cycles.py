"""Tarjan's strongly connected components and the shortest cycle inside one, without recursion."""

from __future__ import annotations

import random
from itertools import pairwise

from oncelog.verify.cycles import shortest_cycle, strongly_connected


def sccs(graph: dict[int, set[int]]) -> list[set[int]]:
    return sorted((set(c) for c in strongly_connected(graph)), key=min)


def test_acyclic_graph_and_self_loops_have_no_component() -> None:
    assert sccs({1: {2, 3}, 2: {3}, 3: set()}) == []
    assert sccs({1: {1}, 2: {2, 3}}) == []


def test_components_are_found_and_separated() -> None:
    graph = {1: {2}, 2: {3}, 3: {1, 4}, 4: {5}, 5: {4, 6}, 6: set(), 7: {1}}
    assert sccs(graph) == [{1, 2, 3}, {4, 5}]


def test_nodes_only_named_as_successors_are_included() -> None:
    assert sccs({1: {2}, 2: {1, 9}}) == [{1, 2}]


def test_shortest_cycle_through_a_node() -> None:
    graph = {1: {2, 5}, 2: {3}, 3: {4}, 4: {1}, 5: {1}}
    assert shortest_cycle(graph, {1, 2, 3, 4, 5}, 1) == [1, 5, 1]
    assert shortest_cycle(graph, {1, 2, 3, 4}, 1) == [1, 2, 3, 4, 1]  # 5 is outside the component
    assert shortest_cycle({1: {2}, 2: set()}, {1, 2}, 1) == []


def test_a_long_cycle_needs_no_recursion() -> None:
    n = 200_000
    graph = {i: {(i + 1) % n} for i in range(n)}
    (component,) = strongly_connected(graph)
    assert len(component) == n
    assert len(shortest_cycle(graph, component, 0)) == n + 1


def test_agrees_with_a_brute_force_reachability_check() -> None:
    rng = random.Random(5)
    for _ in range(50):
        n = rng.randint(2, 12)
        graph = {i: {rng.randrange(n) for _ in range(rng.randint(0, 2))} for i in range(n)}
        reach = {i: _reachable(graph, i) for i in range(n)}
        expected = {frozenset(j for j in range(n) if j in reach[i] and i in reach[j]) | {i} for i in range(n)}
        expected = {c for c in expected if len(c) > 1}
        assert {frozenset(c) for c in strongly_connected(graph)} == expected
        for c in expected:
            start = min(c)
            cycle = shortest_cycle(graph, c, start)
            assert cycle[0] == cycle[-1] == start and all(b in graph[a] for a, b in pairwise(cycle))


def _reachable(graph: dict[int, set[int]], start: int) -> set[int]:
    seen: set[int] = set()
    todo = list(graph[start])
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph.get(node, ()))
    return seen
