from __future__ import annotations

import os
import pickle

import pytest

from forensics.safe_pickle import UnsafePickle, loads_plain


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_plain_containers_round_trip(protocol):
    value = {
        "version": "2.10",
        "entries": [{"seq": 1, "sizes": [[3, 4]], "state": "completed", "ok": True, "t": 1.5, "none": None}],
        "pg_status": {"0": {"last_enqueued_collective": 12}},
        "tuple": (1, 2, 3),
        "bytes": b"\x00\x01",
        "big": 2**70,
        "set": {1, 2},
    }
    shared = [1, 2]
    value["shared"] = [shared, shared]
    assert loads_plain(pickle.dumps(value, protocol=protocol)) == value


def test_a_payload_that_would_run_code_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "created"
    payload = pickle.dumps({"entries": [_PlantedAt(str(marker))]})
    with pytest.raises(UnsafePickle, match="refusing to load"):
        loads_plain(payload)
    assert not marker.exists()


class _PlantedAt:
    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_objects_are_refused():
    with pytest.raises(UnsafePickle):
        loads_plain(pickle.dumps(_PlantedAt("x")))


def test_truncated_pickle_is_a_clear_error():
    data = pickle.dumps({"a": list(range(100))})
    with pytest.raises(UnsafePickle):
        loads_plain(data[: len(data) // 2])
