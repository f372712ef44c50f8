"""Resume state in checkpoints, its JSON mirror, and the refusal of mismatched resumes."""

import json

import pytest
import tensorflow as tf

from deepdanbooru.errors import TrainingError
from deepdanbooru.runstate.state import Counters, RunIdentity, check_identity, read_state_json, write_state_json
from deepdanbooru.training.state import ResumeState, read_checkpoint_state

IDENTITY = RunIdentity("resnet_small", 32, 48, "a" * 64, 17)


def test_checkpoint_round_trip_without_the_model(tmp_path):
    state = ResumeState()
    counters = Counters(used_epoch=2, used_minibatch=31, used_sample=123, offset=40, random_seed=2,
                        epoch_bad_images=1)
    state.assign(counters, IDENTITY, "cafe")
    path = tf.train.Checkpoint(state=state, other=tf.Variable(3.0)).write(str(tmp_path / "ckpt"))
    assert read_checkpoint_state(path) == (counters, IDENTITY)


def test_state_json_mirror(tmp_path):
    counters = Counters(1, 2, 3, 4, 5, 0)
    write_state_json(tmp_path, str(tmp_path / "ckpt-7"), counters, IDENTITY, complete=False, epoch_count=3,
                     train_records=24)
    data = json.loads((tmp_path / "state.json").read_text())
    assert data["checkpoint"] == "ckpt-7"
    assert (data["used_epoch"], data["used_minibatch"], data["used_sample"], data["offset"],
            data["random_seed"]) == (1, 2, 3, 4, 5)
    assert data["model"] == "resnet_small" and data["tags_hash"] == "a" * 64 and data["complete"] is False
    assert read_state_json(tmp_path) == (data, None)
    assert read_state_json(tmp_path / "missing") == (None, None)
    (tmp_path / "state.json").write_text('{"version": 99}')
    assert read_state_json(tmp_path)[1].endswith("state.json: version 99 is not one this version of deepdanbooru reads")
    assert not [p for p in tmp_path.iterdir() if p.name != "state.json"]  # no temporary left


@pytest.mark.parametrize("change, message", [
    ({"model": "resnet_custom_v4"}, "model was 'resnet_small', now 'resnet_custom_v4'"),
    ({"image_height": 64}, "input size .* was 32x48, now 64x48"),
    ({"tags_hash": "b" * 64, "tag_count": 18}, r"tags.txt: content changed \(17 tags then, 18 now\)"),
    ({"tags_hash": "b" * 64}, r"tags.txt: content changed \(17 tags then and now: other names or another order\)"),
])
def test_identity_mismatch_is_refused_with_what_changed(change, message):
    current = RunIdentity(**{**IDENTITY.__dict__, **change})
    with pytest.raises(TrainingError, match=message) as error:
        check_identity(IDENTITY, current, "P/checkpoints", "P/tags.txt", "P/project.json")
    assert "delete P/checkpoints to start fresh" in str(error.value)


def test_same_identity_accepted():
    check_identity(IDENTITY, RunIdentity(**IDENTITY.__dict__), "c", "t", "p")
