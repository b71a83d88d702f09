"""The package's rooms, as the tests hold them: who may import whom, and no circles.

The rooms stand on floors: ``core`` (the log and its folds) at the bottom, then ``control`` (when a
build stops), ``capture`` (where records come from), ``views`` and ``builder``, and ``app`` on top.
A room imports only from its own floor's room or from lower floors; every import counts, those made
inside a function too, since they are dependencies all the same.

The tests have rooms of their own: a test module (``tests/test_*.py``) holds tests, and what two of
them share lives once in a helper module beside them (``cli.py``, ``journals.py``, ``waiting.py``,
...), which they import; no test module imports another or keeps its own copy of a helper.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "trt_otel"
TESTS = PACKAGE.parent / "tests"
FLOORS = {"core": 0, "control": 1, "capture": 2, "views": 3, "builder": 3, "app": 4}
# The package's face: what ``import trt_otel`` and the test doubles show.
FACE = {"trt_otel", "trt_otel.testing", "trt_otel.__main__"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path) -> Iterator[str]:
    """The package's modules that ``path`` imports (``from trt_otel.x import y``: trt_otel.x)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "trt_otel" or node.module.startswith("trt_otel."):
                yield node.module
                # ``from trt_otel.core import readmodel`` imports the module too, where it is one
                for alias in node.names:
                    module = f"{node.module}.{alias.name}"
                    if (PACKAGE.parent / module.replace(".", "/")).with_suffix(".py").is_file():
                        yield module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("trt_otel"):
                    yield alias.name


def room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FLOORS else None


def test_every_module_lives_in_a_room_or_is_the_face() -> None:
    homeless = [name for name in modules() if room(name) is None and name not in FACE]
    assert homeless == []


@pytest.mark.parametrize("lower", ["core", "control", "capture", "views", "builder", "app"])
def test_a_room_imports_only_from_its_floor_or_below(lower: str) -> None:
    wrong = sorted(
        f"{name} imports {target}"
        for name, path in modules().items()
        if room(name) == lower
        for target in imports(path)
        if (target_room := room(target)) is None
        or (target_room != lower and FLOORS[target_room] >= FLOORS[lower])
    )
    assert wrong == []


def test_core_imports_only_core_and_the_standard_library_or_its_own_dependencies() -> None:
    wrong = sorted(
        f"{name} imports {target}"
        for name, path in modules().items()
        if room(name) == "core"
        for target in imports(path)
        if room(target) != "core"
    )
    assert wrong == []


def test_no_module_imports_itself_in_a_circle() -> None:
    # Imports inside functions count: one made late to dodge a circle is still a circle.
    known = modules()  # walked once: not once for each import of each module
    graph = {
        name: {target for target in imports(path) if target in known}
        for name, path in known.items()
    }
    circles: list[list[str]] = []
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            circles.append([*trail[trail.index(name) :], name])
            return
        if name in done:
            return
        for target in sorted(graph[name]):
            # A package's __init__ is run by importing any of its modules: only a real circle
            # between modules counts, not a room importing its own children.
            if not name.startswith(target + "."):
                visit(target, [*trail, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
    assert circles == []


def test_the_views_and_policies_read_the_build_through_a_protocol_not_the_monitor() -> None:
    wrong = sorted(
        f"{name} imports {target}"
        for name, path in modules().items()
        if room(name) in {"views", "control"}
        for target in imports(path)
        if target == "trt_otel.capture.monitor"
    )
    assert wrong == []


MAX_FUNCTION_LINES = 60
LONG = "# Long:"
"""The comment, right above a longer function, that says why it is long."""


def test_no_function_is_long_without_a_reason_beside_it() -> None:
    long = []
    for name, path in modules().items():
        lines = path.read_text(encoding="utf-8").splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            first = node.body[0]
            documented = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            body_starts = first.end_lineno + 1 if documented and first.end_lineno else first.lineno
            assert node.end_lineno is not None
            length = node.end_lineno - body_starts + 1
            top = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            above = [line.strip() for line in lines[max(0, top - 4) : top - 1]]
            if length > MAX_FUNCTION_LINES and not any(a.startswith(LONG) for a in above):
                long.append(f"{name}.{node.name}: {length} lines")
    assert long == []


@pytest.mark.e2e
def test_a_builds_worker_and_import_trt_otel_load_only_what_they_use() -> None:
    """The worker of ``trt-otel build`` imports its target's module and the recorder: none of
    the monitor's fold, the views, their libraries, ``importlib.metadata``, the journal's
    reader (the preflight's) or psutil (the supervisor's, to stop and sample the worker): a
    hundredth to a tenth of a second each, paid by every build, in a process that starts
    bare. ``import trt_otel`` alone is lighter still."""
    import subprocess
    import sys

    heavy = [
        "trt_otel.capture.monitor",
        "trt_otel.core.readmodel",
        "trt_otel.views",
        "trt_otel.app",
        "opentelemetry",
        "prometheus_client",
        "rich",
        "importlib.metadata",
        "trt_otel.core.journal",
        "trt_otel.core.journal_codec",
        "trt_otel.core.journal_reader",
        "psutil",
    ]
    for imports in (
        "trt_otel.builder.build, trt_otel.capture.supervisor",
        "trt_otel.builder.build, trt_otel.capture.worker",
        "trt_otel",
    ):
        code = (
            f"import sys, {imports}\n"
            f"print(sorted({{m for m in sys.modules for h in {heavy!r}"
            " if m == h or m.startswith(h + '.')}))"
        )
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        )
        assert result.stdout.strip() == "[]", (imports, result.stdout)


@pytest.mark.e2e
def test_the_command_line_imports_no_room_a_build_does_not_ask_for() -> None:
    """``trt-otel build`` without options pays for its parser, the session and the views every
    build has (plain lines), not for the HTTP view and its page, the reports, the simulator's
    builder, ``run``'s program session, ``watch``'s supervision, the cancel policies, the
    metrics registry, rich's tree or an HTTP client: each is imported where its command or
    option asks for it."""
    import subprocess
    import sys

    not_asked_for = [
        "trt_otel.views.http",
        "trt_otel.views.http_feed",
        "trt_otel.views.http_hosts",
        "trt_otel.views.web",
        "trt_otel.views.report",
        "trt_otel.builder.simulator.driver",
        "trt_otel.builder.simulator.tensorrt_api",
        "trt_otel.app.program_session",
        "trt_otel.app.run",
        "trt_otel.app.remote",
        "trt_otel.app.fleet",
        "trt_otel.app.fleet_documents",
        "trt_otel.app.fleet_requests",
        "trt_otel.app.fleet_status",
        "trt_otel.app.mcp_server",
        "trt_otel.views.otlp",
        "trt_otel.views.spans",
        "opentelemetry",
        "trt_otel.control.policies",  # a policy option: --timeout, --stall-timeout, ...
        "trt_otel.control.probes",
        "trt_otel.control.runner",
        "trt_otel.control.deadline",
        "trt_otel.views.prometheus",  # a metrics view: --prometheus-port, --http-port, ...
        "prometheus_client",
        "rich",  # the live tree, on a terminal
        "http.client",  # --cancel-url, watch --url (with ssl and email)
    ]
    code = (
        "import sys, trt_otel.app.cli\n"
        f"print(sorted({{m for m in sys.modules for h in {not_asked_for!r}"
        " if m == h or m.startswith(h + '.')}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]", result.stdout


def _producer_calls(path: Path) -> Iterator[str]:
    """Calls of an event log's producer (``log.append``, ``self.log.append``, ...) in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        receiver = node.func.value
        name = receiver.attr if isinstance(receiver, ast.Attribute) else getattr(receiver, "id", "")
        if node.func.attr == "append" and name in ("log", "_log", "event_log"):
            yield f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"


def test_the_monitor_is_the_only_producer_of_the_log() -> None:
    """Every event enters the log through the build's monitor, which checks it against the
    protocol first and stamps it with the time and thread it was made at; the samplers, a
    program's builds and a followed build go through it too."""
    monitor = PACKAGE / "capture" / "monitor.py"
    assert list(_producer_calls(monitor)), "the monitor itself produces through log.append"
    others = [
        call for path in modules().values() if path != monitor for call in _producer_calls(path)
    ]
    assert others == []
    log_source = (PACKAGE / "core" / "log.py").read_text(encoding="utf-8")
    for removed in ("def append_locked", "def append_made", "def append_at", "def extend",
                    "self.stamp"):  # fmt: skip
        assert removed not in log_source, f"a second way into the log: {removed}"


FOLDS = {
    # The build's one fold, made once where a session is assembled: every view reads it.
    "app/session.py": "build, demo: the session's read model",
    "app/program_session.py": "run: the read model of the program's builds",
    "app/remote.py": "watch: the read model of the build followed from its journal",
    # A monitor that no read model folds for (a library user's, each build's under run): the
    # least state its protocol checks need, while the run's read model follows the log.
    "capture/monitor.py": "the monitor's own state, where no model is its fold",
    "capture/program.py": "run: the state before the program's first build (no events)",
    "core/readmodel.py": "the read model's own state: the fold itself",
    # A view made without a read model (a library user's): the model it then folds alone.
    "views/spans.py": "the span projection used on its own",
    "views/otlp_logs.py": "the log projection used on its own",
    # Journals read back: builds that ended, not the one this process runs.
    "views/report/model.py": "a report of a journal",
    "app/cli.py": "replay and watch of a journal, each its own and only fold",
    "app/fleet_status.py": "the fleet's builds, each from its journal",
    "core/eta.py": "earlier builds (--history), each from its journal",
}
"""Where the package folds a build (makes a ``ReadModel`` or a ``BuildState``), and why there."""


def test_a_build_is_folded_once_in_a_process_where_its_session_is_assembled() -> None:
    """The views read the session's one fold of the build (its read model): a view that folds
    the build again (as the live page's timeline once did, doubling memory with every view on)
    makes a fold somewhere new, which this test refuses until it is added above with its
    reason."""
    found: dict[str, list[int]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("ReadModel", "BuildState")
            ):
                found.setdefault(str(path.relative_to(PACKAGE)), []).append(node.lineno)
    assert sorted(set(found) - set(FOLDS)) == [], found
    assert sorted(set(FOLDS) - set(found)) == [], "a fold listed here no longer is one"


def test_every_module_is_named_on_the_architecture_page() -> None:
    """docs/architecture.md names every module of the package in its room's list (a folder's
    modules in the folder's entry), so a reader finds where each piece lives."""
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = set(re.findall(r"(?<![\w.])([A-Za-z_][\w]*\.py)\b", page))
    missing = [
        str(path.relative_to(PACKAGE))
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "__init__.py" and path.name not in named
    ]
    assert missing == []


# -- the tests' own rooms ------------------------------------------------------------------------


def suite_modules() -> list[Path]:
    """The test modules: ``tests/test_*.py``."""
    return sorted(TESTS.glob("test_*.py"))


def helper_modules() -> list[Path]:
    """The tests' helper modules: every other ``tests/*.py`` (conftest.py among them)."""
    return sorted(path for path in TESTS.glob("*.py") if not path.name.startswith("test_"))


def imported_modules(path: Path) -> Iterator[tuple[int, str]]:
    """The absolute imports of ``path``, with their lines, those inside a function too."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name


def top_level_functions(path: Path) -> dict[str, int]:
    """The functions (fixtures among them) that ``path`` defines at its top level, with their
    lines."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.name: node.lineno
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }


def test_no_test_module_imports_another() -> None:
    """What two test modules share is in a helper module: importing a test module would also
    run its module-level code (its skips and marks) and collect its tests twice."""
    suite = {path.stem for path in suite_modules()}
    wrong = sorted(
        f"tests/{path.name}:{line} imports {target}"
        for path in suite_modules()
        for line, target in imported_modules(path)
        if target.split(".")[0] in suite
    )
    assert wrong == [], "move what is shared into a helper module of tests/"


CLI_COMMAND_LINE = re.compile(r"""["']-m["']\s*,\s*["']trt_otel\.app\.cli["']""")
"""The CLI's module given to an interpreter, as a command line spells it in a list."""


def cli_spelled_at(path: Path) -> list[int]:
    """The lines where ``path`` spells :data:`CLI_COMMAND_LINE`."""
    text = path.read_text(encoding="utf-8")
    return [text.count("\n", 0, match.start()) + 1 for match in CLI_COMMAND_LINE.finditer(text)]


def test_the_clis_command_line_is_spelled_only_in_tests_cli() -> None:
    """Every test starts ``python -m trt_otel.app.cli`` through tests/cli.py (``CLI``,
    ``CLI_MODULE`` and its runners), so that how the tests start the command is said once."""
    assert cli_spelled_at(TESTS / "cli.py"), "tests/cli.py spells the command line"
    wrong = [
        f"tests/{path.name}:{line} spells it"
        for path in sorted(TESTS.glob("*.py"))
        if path.name != "cli.py"
        for line in cli_spelled_at(path)
    ]
    assert wrong == [], "use CLI or CLI_MODULE of tests/cli.py"


def test_no_test_module_redefines_a_function_of_a_helper_module() -> None:
    """A helper (or a fixture) of a helper module is imported, not copied: a test module that
    defines one of the same name at its top level keeps a copy of its own (or hides the
    shared one)."""
    shared = {name: path.name for path in helper_modules() for name in top_level_functions(path)}
    wrong = sorted(
        f"tests/{path.name}:{line} defines {name}(), as tests/{shared[name]} does"
        for path in suite_modules()
        for name, line in top_level_functions(path).items()
        if name in shared
    )
    assert wrong == [], "import the helper module's instead"
