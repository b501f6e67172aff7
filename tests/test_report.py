"""The results writer's checks: verdicts and tallies, and figures with a blank panel."""

from experiments.harness import report


def test_claims_a_budget_cannot_decide_are_neither_pass_nor_fail():
    claims = [report.claim("a", True, "1"), report.claim("b", False, "2"), dict(report.claim("c", True, "3"), decided=False)]
    assert [report.verdict(c) for c in claims] == ["PASS", "FAIL", report.UNDECIDED]
    assert report.tally(claims) == f"1 of 2 claims hold; 1 {report.UNDECIDED}"
    assert "PASS" not in report.markdown("x", "smoke", {}, claims[2:])


def test_a_figure_with_a_blank_panel_is_caught():
    fig, (full, blank, guide) = report.figure(ncols=3)
    full.plot([1, 2], [3, 4])
    blank.set_title("nothing here")
    guide.axvline(1.0)                  # a guide line is not data
    guide.set_title("only a guide")
    guide.bar([0, 1], [0, 0])           # nor are bars of no height
    assert report.empty_axes(fig) == ["nothing here", "only a guide"]
    fig2, ax = report.figure()
    ax.bar([0, 1], [0.5, 0])
    assert report.empty_axes(fig2) == []


def test_results_are_written_readable_by_others_as_the_umask_allows(tmp_path):
    import os
    import stat
    old = os.umask(0o022)
    try:
        report.atomic_write(tmp_path / "results.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "results.json").stat().st_mode) == 0o644
