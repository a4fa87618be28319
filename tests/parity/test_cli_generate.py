"""`decoder-parity generate`: streams tokens, compares backends, exits 2 on bad requests with the reason."""

from __future__ import annotations

import pytest

from parity.__main__ import main


def test_generate_both_backends_agree(default_dir, capsys):
    code = main(["generate", str(default_dir), "--prompt", "Hi there", "--max-new-tokens", "8", "--backend", "both"])
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
        (["--max-new-tokens", "0"], "max_new_tokens must be an integer >= 1"),
        (["--max-new-tokens", "600"], "exceeds the model's max_position_embeddings=512"),
        (["--top-p", "1.5"], "top_p must lie in (0, 1]"),
        (["--temperature", "-1"], "temperature must be >= 0"),
        (["--ids", "1,2,999"], "is outside the vocabulary"),
    ],
)
def test_bad_requests_exit_2(default_dir, capsys, args, needle):
    assert main(["generate", str(default_dir), *args]) == 2
    assert needle in capsys.readouterr().err


def test_missing_directory_exits_2(tmp_path, capsys):
    assert main(["generate", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
