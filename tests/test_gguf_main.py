"""``fixturegen.gguf_main.export_main``: the command line the families' ``fixture_gguf`` share. A layout other than
the bundled one without ``--gguf-out`` is argparse's usage error (exit 2, the family's reason, nothing exported);
otherwise ``export(out, gguf_out, value)`` runs and each written path is printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from bloomery_cli.families.deepseek4 import fixture_gguf as ds4
from bloomery_cli.families.glm5next import fixture_gguf as glm5next
from bloomery_cli.families.mimo2 import fixture_gguf as mimo2
from bloomery_cli.families.qwen4exp import fixture_gguf as qwen4exp
from bloomery_cli.fixturegen.gguf_main import export_main


def test_export_runs_with_the_option_and_prints_each_path(capsys, tmp_path):
    calls = []

    def export(out, gguf_out, value):
        calls.append((out, gguf_out, value))
        return (tmp_path / "a.gguf", tmp_path / "b.gguf") if value == "two" else tmp_path / "a.gguf"

    argv = ["--out", "fx", "--gguf-out", str(tmp_path)]
    assert export_main(argv + ["--kind", "two"], "doc", "t", export, "kind", ("one", "two"), "no") == 0
    assert export_main(["--out", "fx"], "doc", "t", export, "kind", ("one", "two"), "no") == 0
    assert calls == [(Path("fx"), tmp_path, "two"), (Path("fx"), None, "one")]
    assert capsys.readouterr().out.split() == [str(tmp_path / "a.gguf"), str(tmp_path / "b.gguf"),
                                               str(tmp_path / "a.gguf")]


@pytest.mark.parametrize("main, argv, reason", [
    (glm5next.main, ["--dtype", "f32"], "--dtype f32 only with --gguf-out (the bundled file is BF16)"),
    (qwen4exp.main, ["--dtype", "f32"], "--dtype f32 only with --gguf-out (the bundled file is BF16)"),
    (mimo2.main, ["--qkv", "split"], "--qkv split only with --gguf-out (the bundled file is the fused layout)"),
    (ds4.main, ["--experts", "bf16"], "--experts bf16 only with --gguf-out (the bundled files are the converter's "
                                      "MXFP4 layout)")], ids=["glm5next", "qwen4exp", "mimo2", "deepseek4"])
def test_a_non_bundled_layout_without_gguf_out_is_exit_2(capsys, tmp_path, main, argv, reason):
    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path / "nothing-here"), *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and reason in err and "Traceback" not in err, err
