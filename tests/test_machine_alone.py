"""The tests and the commands leave the user's machine alone: caches in the run's temporary folder,
no folder of hypothesis's in the directory `saturate check` runs in."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

SMALL_RULES = "ruleset small level 2\nrule add-zero  Add(x, c:const)  => x  if zeros(c), broadcasts_into(c, x)\n"


def test_a_test_run_keeps_every_cache_in_its_own_temporary_folder():
    from saturate.backend.cache import cache_root
    from saturate.lang.rule_cache import cache_dir

    temp = Path(tempfile.gettempdir()).resolve()
    for where in (cache_root(), cache_dir()):
        assert where.resolve().is_relative_to(temp), where
        assert not where.resolve().is_relative_to(Path.home().resolve() / ".cache"), where


def test_saturate_check_leaves_no_hypothesis_folder_where_it_runs(tmp_path):
    (tmp_path / "small.rules").write_text(SMALL_RULES)
    env = {k: v for k, v in os.environ.items() if k != "HYPOTHESIS_STORAGE_DIRECTORY"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    done = subprocess.run([sys.executable, "-m", "saturate", "check", "small.rules", "--examples", "5", "--seed", "0"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "small.rules"]
    assert (tmp_path / "cache" / "saturate" / "hypothesis").is_dir()
