"""The shared CLI plumbing: atomic JSON output and the one-line error wrapper."""

from __future__ import annotations

import json
import os
import stat

import pytest

from dex_adapt.cli.common import CliError, run_with_clean_errors, write_json_atomic


def test_json_output_is_an_ordinary_file_honouring_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        write_json_atomic(str(tmp_path / "sub" / "out.json"), {"a": 1})
    finally:
        os.umask(old)
    path = tmp_path / "sub" / "out.json"
    assert json.loads(path.read_text()) == {"a": 1}
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # not mkstemp's 0600
    assert [p.name for p in path.parent.iterdir()] == ["out.json"]


def test_a_failed_json_write_leaves_neither_a_file_nor_a_temporary(tmp_path):
    with pytest.raises(TypeError):
        write_json_atomic(str(tmp_path / "out.json"), {"a": object()})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("error", [CliError("bad flag"), FileNotFoundError("no such file"), ValueError("bad value")])
def test_bad_input_becomes_one_line_and_exit_2(error, capsys):
    def fail():
        raise error

    assert run_with_clean_errors("dex-test", fail) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dex-test: error: ")
