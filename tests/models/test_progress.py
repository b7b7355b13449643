"""Progress bars in a log: plain lines, at most one per interval, no carriage returns."""

from models.progress import progress_bar


def test_a_bar_in_a_log_writes_a_few_plain_lines(capsys):
    bar = progress_bar(True, total=10_000, desc="steps", leave=False)
    for i in range(10_000):
        bar.update(1)
        bar.set_postfix(loss=1.0 / (i + 1))  # refreshes the bar at every step
    bar.close()
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.splitlines()
    assert 1 <= len(lines) <= 3  # the start, the end: not one line per update
    assert "10000/10000" in lines[-1]


def test_a_disabled_bar_writes_nothing(capsys):
    bar = progress_bar(False, total=10, desc="steps")
    bar.update(10)
    bar.close()
    assert capsys.readouterr().err == ""
