"""No service blocks its event loop on file trees, archives, subprocesses or sleeps: every such call
in an `async def` of services/ or libs/ goes through a thread (levers9.runtime.off_loop). Found by
reading the code, so a new one fails here before it stalls a loaded worker's heartbeats and proxy."""

import ast
import asyncio
from pathlib import Path

from levers9.runtime.off_loop import remove_tree, scratch_dir

ROOT = Path(__file__).resolve().parents[2]
BLOCKING = {("shutil", "rmtree"), ("shutil", "copytree"), ("tempfile", "TemporaryDirectory"), ("tarfile", "open"),
            ("subprocess", "run"), ("subprocess", "check_output"), ("subprocess", "check_call"), ("time", "sleep")}


def blocking_calls(source: str) -> list[tuple[int, str]]:
    """(line, "module.name") of each BLOCKING call made directly in an `async def` (a sync function
    or lambda nested in it runs elsewhere: on a thread, or not on the loop's behalf)."""
    found: list[tuple[int, str]] = []

    def walk(node: ast.AST, in_async: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_async
            if isinstance(child, ast.AsyncFunctionDef):
                inside = True
            elif isinstance(child, (ast.FunctionDef, ast.Lambda)):
                inside = False
            call = child.func if isinstance(child, ast.Call) else None
            if in_async and isinstance(call, ast.Attribute) and isinstance(call.value, ast.Name) \
                    and (call.value.id, call.attr) in BLOCKING:
                found.append((child.lineno, f"{call.value.id}.{call.attr}"))
            walk(child, inside)

    walk(ast.parse(source), False)
    return found


def test_the_finder_sees_a_blocking_call_in_async_code_and_not_in_a_thread_helper():
    source = ("import shutil, asyncio\n"
              "async def bad(p):\n    shutil.rmtree(p)\n"
              "async def good(p):\n    await asyncio.to_thread(shutil.rmtree, p)\n"
              "    def helper():\n        shutil.rmtree(p)\n"
              "def sync(p):\n    shutil.rmtree(p)\n")
    assert blocking_calls(source) == [(3, "shutil.rmtree")]


def test_no_async_function_of_the_services_or_libs_blocks_its_loop():
    offenders = [f"{path.relative_to(ROOT)}:{line} {name}"
                 for top in ("services", "libs") for path in sorted((ROOT / top).rglob("*.py"))
                 for line, name in blocking_calls(path.read_text())]
    assert not offenders, "blocking calls on the event loop (use levers9.runtime.off_loop or asyncio.to_thread):\n" + \
        "\n".join(offenders)


def test_a_scratch_dir_is_there_inside_and_gone_after_even_on_error(tmp_path):
    seen: list[Path] = []

    async def main() -> None:
        async with scratch_dir("l9-test-", tmp_path) as d:
            (d / "a" / "b").mkdir(parents=True)
            (d / "a" / "b" / "f").write_text("x")
            seen.append(d)
        try:
            async with scratch_dir("l9-test-", tmp_path) as d:
                seen.append(d)
                raise ValueError("boom")
        except ValueError:
            pass
        await remove_tree(tmp_path / "never-was")  # nothing there: no error

    asyncio.run(main())
    assert len(seen) == 2 and all(d.parent == tmp_path and d.name.startswith("l9-test-") for d in seen)
    assert not any(d.exists() for d in seen)
