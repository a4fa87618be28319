"""`decoder-parity generate`: streams tokens, compares backends, exits 2 on bad requests with the reason, before
any model loads."""

from __future__ import annotations

import io
import json
import shutil

import pytest

from parity.__main__ import main
from parity.cli_generate import TextStream


@pytest.mark.parametrize("prompt", [["--prompt", "Hi there"], ["--ids", "5"]], ids=["text", "one-token"])
def test_generate_both_backends_agree(default_dir, capsys, prompt):
    code = main(["generate", str(default_dir), *prompt, "--max-new-tokens", "8", "--backend", "both"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "torch and jax generated identical tokens" in out.out
    assert "tokens/s" in out.err


def test_generate_streams_ids_without_tokenizer(tmp_path, capsys):
    import spec

    directory = spec.write_checkpoint(tmp_path, spec.DEFAULT_SPEC, spec.random_weights(spec.DEFAULT_SPEC))
    assert main(["generate", str(directory), "--ids", "5,9,200", "--max-new-tokens", "4", "--no-eos"]) == 0
    streamed = capsys.readouterr().out.split("]", 1)[1].split()
    assert len(streamed) == 4 and all(tok.isdigit() for tok in streamed)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--max-new-tokens", "0"], "argument --max-new-tokens: must be >= 1, got 0"),
        (["--max-new-tokens", "600"], "positions exceed the model's max_position_embeddings=512"),
        (["--top-p", "1.5"], "top_p must lie in (0, 1]"),
        (["--top-k", "0"], "argument --top-k: must be >= 1, got 0"),
        (["--temperature", "-1"], "temperature must be >= 0 (0 = greedy) and finite"),
        (["--temperature", "nan"], "temperature must be >= 0 (0 = greedy) and finite"),
        (["--ids", "1,2,999"], "is outside the vocabulary"),
        (["--ids", "1,99999999999999999999"], "is outside the vocabulary"),
        (["--tp", "0"], "argument --tp: must be >= 1, got 0"),
        (["--tp", "-1"], "argument --tp: must be >= 1, got -1"),
        (["--tp", "3"], "tensor-parallel degree 3 does not fit this model"),
        (["--ep", "2"], "expert-parallel degree 2 needs a mixture-of-experts model (qwen3 is dense)"),
        (["--ep", "0"], "argument --ep: must be >= 1, got 0"),
        (["--seed", "-1"], "argument --seed: must be >= 0, got -1"),
        (["--seed", str(2**70)], "argument --seed: must be <= 9223372036854775807"),
        (["--dtype", "float64"], "invalid choice: 'float64'"),
    ],
)
def test_bad_requests_exit_2_before_loading(default_dir, capsys, args, needle):
    assert main(["generate", str(default_dir), *args]) == 2
    out, err = capsys.readouterr()
    assert needle in err and "Traceback" not in err, err
    assert "[torch]" not in out  # refused before the first backend started


def test_broken_checkpoint_and_tokenizer_exit_2_before_loading(default_dir, tmp_path, capsys):
    directory = shutil.copytree(default_dir, tmp_path / "ckpt")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "intermediate_size": 100}))
    assert main(["generate", str(directory), "--ids", "1,2"]) == 2
    out, err = capsys.readouterr()
    assert "has shape [176, 64], expected [100, 64]" in err and "[torch]" not in out
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "tokenizer.json").write_text("{}")
    assert main(["generate", str(directory), "--prompt", "hi"]) == 2
    assert "is not a valid tokenizer.json" in capsys.readouterr().err
    assert main(["generate", str(directory), "--ids", "1,2"]) == 2  # streaming needs the tokenizer too
    assert "is not a valid tokenizer.json" in capsys.readouterr().err


def test_text_stream_holds_back_a_partial_utf8_character(default_dir):
    """Byte-level tokens: 0xC3 alone decodes to U+FFFD; with 0xA9 it is 'é'. No raw id, no stray U+FFFD."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(default_dir / "tokenizer.json"))
    out = io.StringIO()
    stream = TextStream(lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False), out)
    for step, token in enumerate([ord("a"), 0xC3, 0xA9, ord("b"), 0xE2, 0x82]):  # ends inside a 3-byte "€"
        stream(step, [token])
    assert out.getvalue() == "aéb"
    stream.finish()  # the cut-off character is shown once generation has ended
    assert out.getvalue() == "aéb\ufffd"


def test_missing_directory_exits_2(tmp_path, capsys):
    assert main(["generate", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_generate_expert_parallel_matches_unsharded(hf_checkpoint, capsys):
    """--ep 2 on a mixture-of-experts checkpoint (E = 6): torch over 2 gloo processes, the same greedy tokens."""
    directory = str(hf_checkpoint("qwen3_moe_e6k4"))
    args = ["generate", directory, "--ids", "5,9,200,7", "--max-new-tokens", "6", "--no-eos"]
    assert main(args) == 0
    unsharded = capsys.readouterr().out
    assert main([*args, "--ep", "2"]) == 0
    assert capsys.readouterr().out == unsharded
