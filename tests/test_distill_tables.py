"""docs/results.md's distillation sections are scripts/distill_experiment.py's tables of the committed
docs/distill/*.json (results tables are generated, never typed: a hand edit or a JSON left behind fails here)."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def scripts(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    for name in ("distill_experiment", "distill_report"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import distill_experiment
    import distill_report

    return distill_experiment, distill_report


def test_the_distillation_section_is_the_table_of_the_committed_summaries(scripts):
    experiment, report = scripts
    parts = (*experiment.PARTS.values(), *experiment.LANGUAGE_PARTS.values(), "timing")
    summaries = {p: json.loads((ROOT / f"docs/distill/{p}.json").read_text()) for p in parts}
    block = f"{experiment.BEGIN}\n{report.tables(summaries)}\n{experiment.END}"
    assert block in (ROOT / "docs/results.md").read_text()


def test_the_katz_rows_section_is_the_table_of_the_committed_comparison(scripts):
    _, report = scripts
    comparison = json.loads((ROOT / "docs/distill/katz_rows.json").read_text())
    block = f"{report.ROWS_BEGIN}\n{report.rows_table(comparison)}\n{report.ROWS_END}"
    assert block in (ROOT / "docs/results.md").read_text()


def test_every_row_of_the_katz_rows_comparison_covers_the_three_teachers_of_its_task(scripts):
    """Each task's rows distil its three teacher seeds (their accuracies stored once per task), so a row paired
    with the anchor or with its form's `distill` run pairs seed with seed."""
    _, report = scripts
    comparison = json.loads((ROOT / "docs/distill/katz_rows.json").read_text())
    for task in comparison.values():
        teachers = sorted(int(s) for s in task["teachers"])
        for row in task["rows"]:
            assert sorted(report.row_seeds(row)) == teachers == [0, 1, 2], (task["task"], row["mixer"], row["method"])
            assert row["budget"] == 0.1 or row["method"] == "distill"  # other budgets: the recipe alone


@pytest.fixture
def probe(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    for name in ("distill_experiment", "distill_report", "window_probe"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import window_probe

    return window_probe


def test_the_window_probe_section_is_the_table_of_its_committed_json(probe):
    data = json.loads((ROOT / "docs/distill/window_probe.json").read_text())
    block = f"{probe.BEGIN}\n{probe.table(data)}\n{probe.END}"
    assert block in (ROOT / "docs/results.md").read_text()


def test_the_window_probe_mixes_like_softmax_where_the_window_holds_every_key(probe):
    """A window wider than the grid leaves nothing to the kernel: the probe's layer is then softmax attention
    exactly; with the class token alone exact, a patch's weights on other patches follow phi(q) . phi(k)."""
    import torch

    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 2, 17, 8, dtype=torch.float64).unbind(0)
    fq, fk = torch.rand(2, 2, 17, 4, dtype=torch.float64), torch.rand(2, 2, 17, 4, dtype=torch.float64)
    softmax = (q @ k.transpose(-2, -1) * 8**-0.5).softmax(-1) @ v
    torch.testing.assert_close(probe.hybrid(q, k, fq, fk, v, None, 9).double(), softmax, rtol=1e-6, atol=1e-6)
    mask = probe.window_mask(17, 1, "cpu")  # 1 class token + a 4 x 4 grid; 1 x 1: a patch's own key
    assert mask[0].all() and mask[:, 0].all() and mask[1:, 1:].equal(torch.eye(16, dtype=torch.bool))
    assert probe.window_mask(17, 3, "cpu")[1, 1:].sum() == 4  # a corner patch: itself and 3 neighbours


def test_the_katz_rows_table_pairs_each_row_with_the_anchor_at_its_own_budget(scripts):
    """A row at 5% is paired with the anchor's 5% run, not its 10% one (they differ here by 10 points)."""
    _, report = scripts

    def row(mixer, budget, retention):
        stat = {"n": 3, "values": retention, "mean": sum(retention) / 3, "low": 0.0, "high": 200.0}
        return {"method": "distill", "mixer": mixer, "budget": budget, "seeds": [0, 1, 2], "retention": stat,
                "val_top1": stat}  # fmt: skip

    rows = [
        row("katz_rows:hedgehog", 0.1, [95.0, 96.0, 97.0]),
        row("linear_attention:hedgehog", 0.1, [96.0, 97.0, 98.0]),
        row("katz_rows:hedgehog", 0.05, [90.0, 91.0, 92.0]),
        row("linear_attention:hedgehog", 0.05, [86.0, 87.0, 88.0]),
    ]
    teacher = {"n": 1, "mean": 40.0, "low": None, "high": None}
    part = {"task": "max", "tokens": 16, "teacher_val_top1": teacher, "retrained": False}
    lines = report.rows_table({"max": {**part, "rows": rows}}).splitlines()
    ten = next(line for line in lines if "rows normalised" in line and "| distill |" in line)
    five = next(line for line in lines if "rows normalised" in line and "distill at 5%" in line)
    assert "| -1.0 [-1.0, -1.0] |" in ten  # 95 - 96 on every seed
    assert "| 4.0 [4.0, 4.0] |" in five  # 90 - 86, not 90 - 96
    assert lines.index(ten) < lines.index(five)  # the goal's 10% rows first


def test_the_window_probe_carries_the_katz_series_of_the_per_query_normalised_operator(probe):
    """O = sum_{t>=1} (gamma A^)^t v with A^'s rows summing to 1 (docs/spec/infsa.md 4.1's normalisation), against
    the dense float64 kernel (I - gamma A^)^-1 - I; a per-head discount."""
    import torch

    from linvit.ops.katz import katz_kernel

    torch.manual_seed(0)
    fq, fk, v = torch.rand(2, 3, 17, 4), torch.rand(2, 3, 17, 4), torch.randn(2, 3, 17, 5)
    gamma = torch.tensor([0.3, 0.5, 0.9])
    a = fq.double() @ fk.double().transpose(-2, -1)
    a = a / (a.sum(-1, keepdim=True) + 1e-6)
    expected = katz_kernel(a, gamma.double()) @ v.double()
    torch.testing.assert_close(probe.row_katz(fq, fk, v, gamma, 1e-6).double(), expected, rtol=1e-5, atol=1e-5)


def test_every_language_student_names_its_window_and_stages(scripts, tmp_path):
    """linvit distill picks a window and the stages for a causal teacher when they are left open
    (distillation.recipe), so a student that left them open would change its row when a pick changes (the
    no-window students of the 512-token table got window 64 and attention transfer alone after the default came)."""
    experiment, _ = scripts
    for context in experiment.LANGUAGE_PARTS:
        stages = experiment.language_stages(str(tmp_path), 0, tmp_path / "teacher", context)
        assert len(stages) == (len(experiment.LANGUAGE_STUDENTS) if context == 128 else len(experiment.LONG_STUDENTS))
        for stage in stages:
            argv = stage.argv
            window, kind = argv[argv.index("--window") + 1], argv[argv.index("--stages") + 1]
            assert window == ("64" if "+w64" in stage.info["mixer"] else "0"), stage.name
            assert kind == ("attention" if stage.info["mixer"].endswith("+transfer") else "both"), stage.name
