"""The dependency graph of a plan: unknown and self dependencies, and cycles."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agent_reach_controller.planning.problems import Problem, ProblemCode, pointer_join


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """A step as the graph sees it; `pointer` is the pointer of its `depends_on` list."""

    step_id: str
    depends_on: tuple[str, ...]
    pointer: str


def dependency_problems(nodes: Sequence[Node]) -> list[Problem]:
    """unknown_dependency, self_dependency and cycle problems, in step order."""
    known = {node.step_id for node in nodes}
    problems: list[Problem] = []
    for node in nodes:
        for index, dep in enumerate(node.depends_on):
            where = pointer_join(node.pointer, index)
            if dep == node.step_id:
                detail = f"step {dep!r} depends on itself"
                problems.append(
                    Problem(pointer=where, code=ProblemCode.SELF_DEPENDENCY, detail=detail)
                )
            elif dep not in known:
                detail = (
                    f"step {node.step_id!r} depends on {dep!r}, which is not a step of the plan"
                )
                problems.append(
                    Problem(pointer=where, code=ProblemCode.UNKNOWN_DEPENDENCY, detail=detail)
                )
    return problems + _cycle_problems(nodes)


def _edges(nodes: Sequence[Node]) -> dict[str, list[str]]:
    first: dict[str, Node] = {}
    for node in nodes:
        first.setdefault(node.step_id, node)
    return {
        sid: [d for d in node.depends_on if d in first and d != sid] for sid, node in first.items()
    }


def find_cycles(edges: dict[str, list[str]]) -> list[list[str]]:
    """Distinct cycles reachable by depth-first search, each as a list of step ids.

    Iterative (a 1,000-step chain must not hit the recursion limit); each cycle is reported once
    (by its set of steps), rotated to start at the step that comes first in `edges`.
    """
    order = {sid: i for i, sid in enumerate(edges)}
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    cycles: list[list[str]] = []
    seen: set[frozenset[str]] = set()
    for root, root_deps in edges.items():
        if root in state:
            continue
        path: list[str] = [root]
        iters = [iter(root_deps)]
        state[root] = 1
        while path:
            nxt = next(iters[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                iters.pop()
            elif state.get(nxt) == 1:
                cycle = path[path.index(nxt) :]
                if frozenset(cycle) not in seen:
                    seen.add(frozenset(cycle))
                    start = min(range(len(cycle)), key=lambda i: order[cycle[i]])
                    cycles.append(cycle[start:] + cycle[:start])
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                iters.append(iter(edges[nxt]))
    return cycles


def _cycle_problems(nodes: Sequence[Node]) -> list[Problem]:
    by_id: dict[str, Node] = {}
    for node in nodes:
        by_id.setdefault(node.step_id, node)
    problems: list[Problem] = []
    for cycle in find_cycles(_edges(nodes)):
        head = by_id[cycle[0]]
        # head depends on the step that precedes it in the cycle's dependency chain
        dep = cycle[1] if len(cycle) > 1 else cycle[0]
        where = pointer_join(head.pointer, head.depends_on.index(dep))
        chain = " -> ".join([*cycle, cycle[0]])
        detail = f"steps form a dependency cycle: {chain} (each depends on the next)"
        problems.append(Problem(pointer=where, code=ProblemCode.CYCLE, detail=detail))
    return problems
