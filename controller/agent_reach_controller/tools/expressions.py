"""CEL names: the variables and functions an expression uses that its evaluator will not have.

Every CEL site is evaluated with a fixed set of variables and the engine's own functions: a
step's `when` with `steps` and `context` (planning/conditions.py), a tool's rate-limit and
concurrency keys and its effects and cost units with `args`. Any other name fails only when the
expression is evaluated ("Undefined variable or function"), or silently for a key (every call
shares the key of null), so each site is checked against its variables when it is submitted or
loaded.

The library reports what a compiled program references (`Program.variables()`, `.functions()`,
a static walk of its AST), with one flaw: the variable a comprehension macro binds (the `x` in
`items.exists(x, x > 0)`) is reported as read. So each macro's variable is renamed apart inside
the macro's arguments, with the tokens of the source (string literals, comments and field
selections left alone), and the renamed source is compiled again to ask for its free variables.
A name bound by a macro and also used outside it (`l.exists(x, x > 0) && x`) is still reported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from agent_reach_controller.tools.cel_engine import cel

# A tool's expressions (rate-limit and concurrency keys, effects and cost units) are evaluated
# over the step's resolved arguments, `args`, and nothing else (planning/conditions.evaluate_key).
TOOL_VARIABLES = frozenset({"args"})

# The functions of the engine (cel 0.14.5 in common-expression-language 0.10) when nothing is
# registered: `program.execute(dict)`. The extras of `cel.stdlib` (min, max, join, ...) are not
# registered by this project, so they are unknown here as they are at run time.
BUILTIN_FUNCTIONS = frozenset(
    {
        "bytes",
        "contains",
        "double",
        "duration",
        "dyn",
        "endsWith",
        "getDate",
        "getDayOfMonth",
        "getDayOfWeek",
        "getDayOfYear",
        "getFullYear",
        "getHours",
        "getMilliseconds",
        "getMinutes",
        "getMonth",
        "getSeconds",
        "hasValue",
        "int",
        "matches",
        "or",
        "orValue",
        "size",
        "startsWith",
        "string",
        "timestamp",
        "type",
        "uint",
        "value",
    }
)
# Functions called by a qualified name (`optional.of(x)`): the library reports the namespace as
# a variable and the last part as a function.
QUALIFIED_FUNCTIONS = frozenset({"optional.of", "optional.none", "optional.ofNonZeroValue"})
# Type names the engine resolves as values (`type(x) == int`).
TYPE_NAMES = frozenset(
    {
        "bool",
        "bytes",
        "double",
        "int",
        "list",
        "map",
        "null_type",
        "optional_type",
        "string",
        "type",
        "uint",
    }
)
# Comprehension macros (expanded by the parser) and the numbers of arguments they take; the first
# argument is the variable they bind. A call with another number of arguments is no macro.
MACROS = {
    "all": (2,),
    "exists": (2,),
    "exists_one": (2,),
    "existsOne": (2,),
    "filter": (2,),
    "map": (2, 3),
}

_TOKEN = re.compile(
    r"""
    (?P<string>
        (?:[bB]?[rR]|[rR][bB])   # raw: a backslash escapes nothing
        (?:'''.*?'''|\"\"\".*?\"\"\"|'[^'\n\r]*'|"[^"\n\r]*")
      | [bB]?
        (?:'''(?:\\.|[^\\])*?'''|\"\"\"(?:\\.|[^\\])*?\"\"\"
          |'(?:\\.|[^'\\\n\r])*'|"(?:\\.|[^"\\\n\r])*")
    )
    | (?P<comment>//[^\n]*)
    | (?P<space>\s+)
    | (?P<number>0[xX][0-9a-fA-F]+[uU]?|\d*\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+[uU]?)
    | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<other>.)
    """,
    re.VERBOSE | re.DOTALL,
)
_BLANKS = ("space", "comment")
_OPENING = {"(", "[", "{"}
_CLOSING = {")", "]", "}"}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, slots=True, kw_only=True)
class UnknownNames:
    """The names an expression uses that its evaluator does not provide (each sorted)."""

    variables: tuple[str, ...] = ()
    functions: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.variables or self.functions)

    def sentences(self, declared: frozenset[str]) -> list[str]:
        """One phrase per name, to follow the expression's name ("the condition uses ...")."""
        allowed = " and ".join(f"`{name}`" for name in sorted(declared))
        verb = "is" if len(declared) == 1 else "are"
        return [
            f"uses undeclared variable {name!r} (only {allowed} {verb} declared)"
            for name in self.variables
        ] + [f"calls unknown function {name!r}" for name in self.functions]


@lru_cache(maxsize=1024)
def unknown_names(source: str, *, variables: frozenset[str]) -> UnknownNames:
    """What an expression reads beyond `variables` and the engine's own names (cached).

    Only the root of a field selection is a variable (`steps.a.output.x` reads `steps`).
    Raises ValueError when `source` does not compile.
    """
    renamed, fresh = _renamed_apart(source)
    program = cel.compile(renamed)
    functions = {f for f in program.functions() if _IDENT.fullmatch(f)}
    free = {v for v in program.variables() if v not in fresh}
    return UnknownNames(
        variables=tuple(sorted(free - variables - TYPE_NAMES)),
        functions=tuple(sorted(functions - fresh - BUILTIN_FUNCTIONS)),
    )


class _Code:
    """The tokens of a source, addressed by position among those that are not blanks."""

    def __init__(self, source: str) -> None:
        self.tokens = [(m.lastgroup or "other", m.group()) for m in _TOKEN.finditer(source)]
        self.code = [i for i, (kind, _) in enumerate(self.tokens) if kind not in _BLANKS]

    def __len__(self) -> int:
        return len(self.code)

    def kind(self, at: int) -> str:
        return self.tokens[self.code[at]][0] if 0 <= at < len(self.code) else ""

    def text(self, at: int) -> str:
        return self.tokens[self.code[at]][1] if 0 <= at < len(self.code) else ""

    def replace(self, at: int, kind: str, text: str) -> None:
        self.tokens[self.code[at]] = (kind, text)

    def idents(self) -> set[str]:
        return {text for kind, text in self.tokens if kind == "ident"}

    def source(self) -> str:
        return "".join(text for _, text in self.tokens)

    def is_variable(self, at: int, name: str) -> bool:
        """`name` read as a variable at `at`: not a field (`a.name`) nor a call (`name(`)."""
        return (
            self.kind(at) == "ident"
            and self.text(at) == name
            and self.text(at - 1) != "."
            and self.text(at + 1) != "("
        )

    def is_qualified_call(self, at: int) -> bool:
        """`namespace.function(` at `at`, naming a builtin, and not itself a field selection."""
        return (
            self.kind(at) == "ident"
            and self.text(at - 1) != "."
            and self.text(at + 1) == "."
            and self.kind(at + 2) == "ident"
            and self.text(at + 3) == "("
            and f"{self.text(at)}.{self.text(at + 2)}" in QUALIFIED_FUNCTIONS
        )

    def macro_end(self, at: int) -> int | None:
        """Where the arguments of a macro call `.name(var, ...)` at `at` end (the `)`)."""
        arities = MACROS.get(self.text(at)) if self.kind(at) == "ident" else None
        if arities is None or self.text(at - 1) != "." or self.text(at + 1) != "(":
            return None
        if self.kind(at + 2) != "ident" or self.text(at + 3) != ",":
            return None
        depth, commas = 0, 0
        for inner in range(at + 1, len(self)):
            token = self.text(inner)
            if token in _OPENING:
                depth += 1
            elif token in _CLOSING:
                depth -= 1
                if depth == 0:
                    return inner if commas + 1 in arities else None
            elif token == "," and depth == 1:
                commas += 1
        return None


def _renamed_apart(source: str) -> tuple[str, frozenset[str]]:
    """`source` with each macro's variable renamed inside the macro, and each qualified builtin
    call (`optional.of(`) made one fresh function name; and the fresh names used.

    Macros are visited outside in: an inner macro binding the same name (shadowing it) was
    renamed with the outer one, and is renamed again within its own arguments.
    """
    code = _Code(source)
    prefix = "_cel"
    while any(name.startswith(prefix) for name in code.idents()):
        prefix += "_"
    fresh: list[str] = []
    for at in range(len(code)):
        if code.is_qualified_call(at):
            fresh.append(f"{prefix}{len(fresh)}")
            code.replace(at, "ident", fresh[-1])
            code.replace(at + 1, "space", "")
            code.replace(at + 2, "space", "")
            continue
        end = code.macro_end(at)
        if end is None:
            continue
        bound = code.text(at + 2)
        fresh.append(f"{prefix}{len(fresh)}")
        for inner in range(at + 2, end):
            if code.is_variable(inner, bound):
                code.replace(inner, "ident", fresh[-1])
    return code.source(), frozenset(fresh)


def check_names(source: str, *, variables: frozenset[str], what: str) -> str:
    """`source` if it compiles and uses only `variables` and the engine's functions.

    Raises ValueError naming the expression (`what`, e.g. "key") and each problem.
    """
    try:
        cel.compile(source)
    except Exception as exc:  # the Rust binding raises ValueError, and others on odd input
        message = str(exc).replace("\n", " ").strip()
        raise ValueError(f"{what} does not compile as CEL: {message}") from None
    unknown = unknown_names(source, variables=variables)
    if unknown:
        raise ValueError("; ".join(f"{what} {s}" for s in unknown.sentences(variables)))
    return source
