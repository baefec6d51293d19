"""What a plain install of saturate-onnx pulls in, measured on the installed packages of this machine.

    python bench/install_size.py [--extras check,c,cluster,bench]

For each runtime dependency (the distribution's Requires-Dist without an extra), the packages it
brings with everything they require, and the disk their installed files take (their RECORD); the
"only" columns count what no other runtime dependency also needs, so they add up to what leaving
that one dependency out would save. Then each extra's addition to the runtime. Nothing is
downloaded: a package this machine lacks is listed as missing and not counted.
"""

from __future__ import annotations

import argparse
from importlib.metadata import PackageNotFoundError, distribution

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

DISTRIBUTION = "saturate-onnx"


def requirements(name: str, extra: str | None = None) -> list[str]:
    """The packages `name` requires (with `extra`: only those the extra adds), markers evaluated here."""
    found = []
    for text in distribution(name).requires or []:
        req = Requirement(text)
        wanted = req.marker is None or req.marker.evaluate({"extra": extra or ""})
        if wanted and (extra is None or (req.marker is not None and "extra" in str(req.marker))):
            found.append(canonicalize_name(req.name))
    return found


def closure(roots: list[str], missing: set[str]) -> set[str]:
    """`roots` and every package they require, transitively, among those installed."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen or name in missing:
            continue
        try:
            todo += requirements(name)
        except PackageNotFoundError:
            missing.add(name)
            continue
        seen.add(name)
    return seen


def installed_bytes(name: str) -> int:
    """Bytes of the files the package installed (its RECORD), those still there."""
    total = 0
    for f in distribution(name).files or []:
        path = f.locate()
        if path.is_file():
            total += path.stat().st_size
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extras", default="check,c,cluster,bench", help="extras to measure beside the runtime")
    args = parser.parse_args()
    missing: set[str] = set()
    roots = requirements(DISTRIBUTION)
    per_root = {r: closure([r], missing) for r in roots}
    runtime = set().union(*per_root.values())
    size = {n: installed_bytes(n) for n in runtime}
    mb = lambda names: sum(size.get(n, 0) or installed_bytes(n) for n in names) / 1e6  # noqa: E731

    print(f"runtime of {DISTRIBUTION} {distribution(DISTRIBUTION).version}: {len(runtime)} packages, "
          f"{mb(runtime):.0f} MB installed")
    print(f"{'dependency':<16} {'packages':>8} {'MB':>7} {'only':>5} {'MB only':>8}")
    for root in sorted(per_root, key=lambda r: -mb(per_root[r])):
        others = set().union(*(c for r, c in per_root.items() if r != root))
        only = per_root[root] - others
        print(f"{root:<16} {len(per_root[root]):>8} {mb(per_root[root]):>7.1f} {len(only):>5} {mb(only):>8.1f}")
    for root in sorted(per_root, key=lambda r: -mb(per_root[r]))[:1]:
        others = set().union(*(c for r, c in per_root.items() if r != root))
        heavy = sorted(per_root[root] - others, key=lambda n: -size[n])
        print(f"largest packages only {root} brings: "
              + ", ".join(f"{n} {size[n] / 1e6:.1f}" for n in heavy[:8]) + " (MB)")
    for extra in [e for e in args.extras.split(",") if e]:
        added = closure(requirements(DISTRIBUTION, extra), missing) - runtime
        print(f"[{extra}] adds {len(added)} packages, {mb(added):.0f} MB: {', '.join(sorted(added)) or '-'}")
    if missing:
        print(f"not installed here (not counted): {', '.join(sorted(missing))}")


if __name__ == "__main__":
    main()
