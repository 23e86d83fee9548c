"""Ambiguity of a position automaton (repair/io/regex_safety.py builds it): the graph searches that tell whether
a backtracking matcher's work grows exponentially or polynomially with the length of the text."""

from __future__ import annotations

MAX_DEGREE = 2  # polynomial backtracking allowed: n^2 steps on a name of n characters


def _components(count: int, successors) -> list[list[int]]:
    """Strongly connected components (iterative Tarjan), each a list of nodes."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    for root in range(count):
        if root in index:
            continue
        work = [(root, iter(successors(root)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    out.append(component)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(successors(child))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return out


def two_paths(loop: list[int], follow, masks: list[int]) -> bool:
    """EDA inside one loop: from some (q, q), two walks reading the same characters part (different transitions)
    and meet again at (q, q). Searched on the pair graph restricted to the loop's positions."""
    members = set(loop)
    inner = {p: [(t, i) for t, i in follow[p] if t in members] for p in loop}
    if len(loop) == 1 and len(inner[loop[0]]) == 1:
        return False  # a single character loop (`\d+`, `.*`): one way round
    pairs = {(p, p) for p in loop}
    frontier, edges = list(pairs), []
    while frontier:
        a, b = frontier.pop()
        for ta, ia in inner[a]:
            for tb, ib in inner[b]:
                if masks[ta] & masks[tb]:
                    edges.append(((a, b), (ta, tb), ia != ib))
                    if (ta, tb) not in pairs:
                        pairs.add((ta, tb))
                        frontier.append((ta, tb))
    nodes = sorted(pairs)
    number = {n: i for i, n in enumerate(nodes)}
    successors = [[] for _ in nodes]
    for source, target, _ in edges:
        successors[number[source]].append(number[target])
    component_of = {}
    for c, component in enumerate(_components(len(nodes), lambda i: successors[i])):
        for i in component:
            component_of[i] = c
    diagonal = {component_of[number[(p, p)]] for p in loop}
    return any(split and component_of[number[s]] == component_of[number[t]] in diagonal for s, t, split in edges)


def degree(loops: list[list[int]], follow, masks: list[int]) -> int:
    """The longest chain of loops L1 -> L2 -> ... in which each next loop can read what the previous one reads,
    after a path between them that can read it too (IDA), so their splits of a name multiply."""
    if len(loops) <= MAX_DEGREE:
        return len(loops)
    owner = {p: i for i, loop in enumerate(loops) for p in loop}
    alphabet = [0] * len(loops)
    for i, loop in enumerate(loops):
        for p in loop:
            alphabet[i] |= masks[p]
    best = [1] * len(loops)
    for i in range(len(loops)):  # loops are in pattern order: a path only leads to a later one
        best[i] = max([1] + [best[j] + 1 for j in _linked(i, loops, owner, alphabet, follow, masks)])
    return max(best)


def _linked(i: int, loops, owner, alphabet, follow, masks) -> set[int]:
    """Loops j before loop i (in pattern order) that reach it by a path every step of which can read a character
    both loops read."""
    out = set()
    for j in range(i):
        common = alphabet[i] & alphabet[j]
        if not common:
            continue
        seen, frontier = set(loops[j]), list(loops[j])
        while frontier:
            p = frontier.pop()
            for t, _ in follow[p]:
                if t not in seen and masks[t] & common:
                    if owner.get(t) == i:
                        out.add(j)
                        frontier = []
                        break
                    seen.add(t)
                    frontier.append(t)
    return out
