"""`multispec theory` end to end on a small instance: figures written, numbers consistent."""

import json

import pytest

from multispec.entrypoints.cli import main


@pytest.mark.slow
def test_theory_cli_writes_three_figures_and_json(tmp_path, capsys):
    out = tmp_path / "th"
    assert (
        main(["theory", "--runs", "40", "--vocab", "4", "--horizon", "8", "--batch", "3", "--out", str(out), "--json"])
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    for name in ("fig_a_rejections.png", "fig_b_batch.png", "fig_c_pareto.png", "theory.json"):
        assert (out / name).stat().st_size > 1000
    a = data["fig_a"]
    assert a["batch-sd M=3"]["exact"] <= a["sd"]["exact"]
    b = data["fig_b"]
    assert b["expected_rejections"][0] == a["sd"]["exact"] and b["limit"] <= b["expected_rejections"][-1]
    for m in data["fig_c"]["measured"]:
        if m["resample"] == "opt":
            assert abs(m["exact_rejection"] + m["exact_bias"] - data["fig_c"]["tv"]) < 1e-9


def test_theory_cli_rejects_bad_options(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["theory", "--out", str(f), "--runs", "5"]) == 2
    assert "is a file" in capsys.readouterr().err
    assert main(["theory", "--batch", "two"]) == 2
