import logging

import pytest

from specdecode.core.metrics import Stats
from specdecode.decoding.taskstate import TaskState
from specdecode.errors import UserError


def stats(accepted_per_step, k=4):
    s = Stats(prefills=1)
    for a in accepted_per_step:
        s.observe(k, a, a + 1)
    return s


def test_state_persists_across_restarts(tmp_path):
    path = tmp_path / "state.json"
    st = TaskState(path)
    st.observe("code", "ngram", stats([4, 4, 2]), speedup=1.6)
    st.observe("code", "ngram", stats([4, 0]), speedup=1.2)
    st.save()
    again = TaskState(path)
    rec = again.get("code", "ngram")
    assert rec.requests == 2 and rec.drafted == 20 and rec.accepted == 14
    assert rec.speedup == pytest.approx(0.8 * 1.6 + 0.2 * 1.2)
    assert rec.profile[0] == pytest.approx(0.8 * 1.0 + 0.2 * 0.5)  # conditional acceptance of position 1
    assert again.get("code", "eagle") is None


def test_corrupt_state_file_is_a_clear_error(tmp_path):
    path = tmp_path / "state.json"
    path.write_text("{broken")
    with pytest.raises(UserError, match="not a specdecode state file"):
        TaskState(path)


def test_drift_alert_names_the_task(caplog):
    st = TaskState(window=10, baseline_n=10, drift_drop=0.25)
    with caplog.at_level(logging.WARNING, logger="specdecode.drift"):
        alerts = [st.observe("sql", "ngram", stats([3, 3, 3, 3])) for _ in range(10)]  # α 0.75 baseline
        alerts += [st.observe("sql", "ngram", stats([3, 3, 3, 2])) for _ in range(10)]  # mild dip: no alert
        assert not any(alerts)
        alerts = [st.observe("sql", "ngram", stats([1, 0, 1, 0])) for _ in range(10)]  # α 0.125
    assert sum(alerts) == 1 and st.get("sql", "ngram").drift_alerts == 1
    assert "acceptance drift on task 'sql'" in caplog.text
