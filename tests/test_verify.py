"""Tests of bert_jax.data.verify: a shard cut short or with a flipped byte is named, with its byte and the fix, at
start-up, by the verify command, or when the input meets it mid-run; never as TensorFlow's traceback."""

import os

import ml_collections
import pytest

from bert_jax import record_framing
from bert_jax.data import input_pipeline
from bert_jax.data import instances
from bert_jax.data import tfrecord
from bert_jax.data import verify

SEQ, PRED, RECORDS = 16, 3, 64
FIX = "Fix: remake it (python -m bert_jax.data.create ...) or recopy it"


def _instance(index):
    tokens = [101] + [1000 + (index * 7 + position) % 500 for position in range(SEQ - 3)] + [102, 103]
    return instances.TrainingInstance(tokens[:SEQ], [0] * SEQ, [1, 2], [tokens[1], tokens[2]], index % 2)


def _write_shard(path, first, count=RECORDS, max_seq_length=SEQ):
    writer = record_framing.TFRecordWriter(str(path))
    offsets, offset = [], 0
    for index in range(first, first + count):
        record = tfrecord.serialize_example(_instance(index), max_seq_length=max_seq_length,
                                            max_predictions_per_seq=PRED)
        writer.write(record)
        offsets.append(offset)
        offset += len(record) + 16
    writer.close()
    return str(path), offsets


def _shards(directory, count=2):
    os.makedirs(directory, exist_ok=True)
    return [_write_shard(os.path.join(directory, f"train-{index:05d}.tfrecord"), index * RECORDS)
            for index in range(count)]


def _cut(path, size):
    with open(path, "r+b") as file:
        file.truncate(size)


def _flip(path, position):
    with open(path, "r+b") as file:
        file.seek(position)
        byte = file.read(1)[0]
        file.seek(position)
        file.write(bytes([byte ^ 0x10]))


def _data_config(files):
    return ml_collections.ConfigDict({"source": "tfrecord", "input_files": files, "eval_input_files": "",
                                      "max_seq_length": SEQ, "max_predictions_per_seq": PRED, "shuffle_buffer": 8,
                                      "num_parallel_reads": 2})


@pytest.mark.parametrize("damage, problem", [("cut", "cut short: the record at byte {offset} runs to byte"),
                                             ("length", "length CRC mismatch: the length of the record at byte "
                                                        "{offset}")], ids=["cut", "length"])
def test_a_shard_cut_short_or_with_a_bad_length_fails_at_start_up(tmp_path, damage, problem):
    (good, _), (bad, offsets) = _shards(tmp_path)
    offset = offsets[40]
    if damage == "cut":
        _cut(bad, offset + 20)  # as an interrupted copy leaves it: inside a record
    else:
        _flip(bad, offset + 3)
    with pytest.raises(verify.DamagedShardError) as error:  # building the input, before any batch is read
        input_pipeline.make_iterator(_data_config(f"{tmp_path}/*.tfrecord"), split="train", batch_size=4,
                                     vocab_size=30522, seed=0)
    message = str(error.value)
    assert message.startswith(f"damaged shard {bad}: " + problem.format(offset=offset)), message
    assert f"the records before byte {offset} are whole" in message and FIX in message
    assert "leave it out of --config.data.input_files knowingly" in message
    assert good not in message


def test_a_flipped_data_byte_mid_run_names_the_shard_not_a_data_loss_traceback(tmp_path):
    (good, _), (bad, offsets) = _shards(tmp_path)
    _flip(bad, offsets[50] + 12 + 5)  # inside the data: the header walk at start-up passes it
    batches = input_pipeline.make_iterator(_data_config(f"{tmp_path}/*.tfrecord"), split="train", batch_size=4,
                                           vocab_size=30522, seed=0)
    with pytest.raises(verify.DamagedShardError) as error:
        for _ in range(2 * RECORDS):
            next(batches)
    message = str(error.value)
    assert message.startswith(f"damaged shard {bad}: data CRC mismatch: the data of the record at byte "
                              f"{offsets[50]} fails its CRC"), message
    assert FIX in message
    # Without TF's byte (another message), every record is read to find it.
    assert verify.locate_damage([good, bad], "unexpected end", flag="--flag").offset == offsets[50]


def test_a_record_of_another_layout_mid_run_names_the_shard_not_a_parse_traceback(tmp_path):
    (_, _), (other, offsets) = _shards(tmp_path)
    with open(other, "ab") as file:  # framed well, so only parsing it fails
        file.write(record_framing.frame_record(tfrecord.serialize_example(
            _instance(0), max_seq_length=SEQ + 4, max_predictions_per_seq=PRED)))
    batches = input_pipeline.make_iterator(_data_config(f"{tmp_path}/*.tfrecord"), split="train", batch_size=4,
                                           vocab_size=30522, seed=0)
    with pytest.raises(ValueError) as error:
        for _ in range(2 * RECORDS):
            next(batches)
    end = offsets[-1] + (offsets[-1] - offsets[-2])
    assert str(error.value).startswith(f"damaged shard {other}: feature layout differs: the record at byte {end} "
                                       "does not parse as the first shard's"), str(error.value)
    assert FIX in str(error.value) and "--config.data.input_files" in str(error.value)


def test_the_verify_command_names_each_damaged_shard_and_exits_1(tmp_path, capsys):
    shards = _shards(tmp_path, count=4)
    (_, _), (flipped, flipped_offsets), (cut, cut_offsets), (other, other_offsets) = shards
    _flip(flipped, flipped_offsets[10] + 12 + 9)
    _cut(cut, cut_offsets[-1] + 5)
    # A record of another layout halfway through a shard: framed well, but the run could not parse it.
    with open(other, "ab") as file:
        file.write(record_framing.frame_record(tfrecord.serialize_example(
            _instance(0), max_seq_length=SEQ + 4, max_predictions_per_seq=PRED)))
    # In this process: a subprocess would spend ~10 s importing TensorFlow, for the same exit code and lines.
    assert verify.main([str(tmp_path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"damaged shard {flipped}: data CRC mismatch: the data of the record at byte "
                               f"{flipped_offsets[10]}"), lines
    assert lines[1].startswith(f"damaged shard {cut}: cut short: the file ends at byte {cut_offsets[-1] + 5}, "
                               f"inside the 12-byte header of the record at byte {cut_offsets[-1]}"), lines
    other_end = other_offsets[-1] + (other_offsets[-1] - other_offsets[-2])
    assert lines[2].startswith(f"damaged shard {other}: feature layout differs: the record at byte {other_end} "
                               "does not parse as the first shard's"), lines
    assert all(FIX in line for line in lines[:3])
    assert lines[3].startswith("verified 4 shard(s): ") and lines[3].endswith("3 problem(s)"), lines


def test_whole_shards_verify_with_a_summary_and_exit_0(tmp_path, capsys):
    _shards(tmp_path, count=2)
    assert verify.main([str(tmp_path), f"--max_seq_length={SEQ}"]) == 0
    output = capsys.readouterr().out.splitlines()
    assert len(output) == 1 and output[0].startswith(f"verified 2 shard(s): {2 * RECORDS} records, ")
    assert output[0].endswith("all whole")
    assert verify.main([str(tmp_path), "--framing_only"]) == 0 and "all whole" in capsys.readouterr().out
    # The configured length the run will read is held to the data's.
    assert verify.main([str(tmp_path), f"--max_seq_length={SEQ * 2}"]) == 1
    assert f"feature 'input_ids' has length {SEQ}, but --max_seq_length={SEQ * 2}" in capsys.readouterr().out
