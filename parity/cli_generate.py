"""`decoder-parity generate [CHECKPOINT_DIR]`: greedy or sampled generation with either backend, or both.

Tokens stream to stdout as they are produced (decoded with the checkpoint's tokenizer.json when present,
else as ids); tokens/s goes to stderr at the end. `--backend both` runs torch_impl then jax_impl on the
same request and reports the first step where they differ. `--tp N` runs the tensor-parallel path (JAX on
N simulated CPU devices; torch on N gloo processes); `--ep N` (mixture-of-experts models) shards the experts
too. The whole request (options, ids, sampling, the checkpoint's headers) is validated before any model loads,
so bad input exits 2 in a second.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from parity.environment import prepare_environment
from parity.inputs import int_option, parse_ids, tokenize
from spec import Checkpoint, InputError, ModelSpec, allow_nonfinite_weights, default_checkpoint
from spec.generation import SamplingParams, prepare_prompts
from spec.inputs import MAX_SEED
from spec.json_fields import MAX_SIZE
from spec.parallel import check_ep_degree, check_tp_degree

_REPLACEMENT = "\ufffd"  # what a decoder shows for a UTF-8 character cut off mid-way


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("generate", help="generate tokens with torch_impl, jax_impl, or both")
    p.add_argument("checkpoint", nargs="?", type=Path, help="Hugging Face checkpoint dir (default: built-in)")
    p.add_argument("--backend", choices=("torch", "jax", "both"), default="torch")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--prompt", help="text, tokenized with the checkpoint's tokenizer.json")
    source.add_argument("--ids", help="token ids, e.g. '1,2,3' (rows separated by ';')")
    p.add_argument("--max-new-tokens", type=int_option(1, MAX_SIZE), default=32)
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    p.add_argument("--kernels", choices=("reference", "fused", "auto"), default="reference")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int_option(1, MAX_SIZE))
    p.add_argument("--top-p", type=float)
    p.add_argument("--seed", type=int_option(0, MAX_SEED), default=0, help="in [0, 2**63)")
    p.add_argument("--no-eos", action="store_true", help="ignore the checkpoint's EOS ids")
    p.add_argument(
        "--tp", type=int_option(1, MAX_SIZE), default=1, help="tensor-parallel degree (simulated devices on CPU)"
    )
    p.add_argument(
        "--ep",
        type=int_option(1, MAX_SIZE),
        default=1,
        help="expert-parallel degree (mixture-of-experts models; times --tp devices or processes)",
    )
    p.add_argument("--allow-nonfinite", action="store_true", help="load weights holding NaN/Inf (debugging)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    directory = args.checkpoint if args.checkpoint is not None else default_checkpoint()
    if not Path(directory).is_dir():
        raise InputError(f"checkpoint directory {directory} does not exist")
    spec = ModelSpec.from_pretrained(directory)  # an unsupported config fails here, before anything loads
    Checkpoint(directory).validate(spec)  # so does a broken checkpoint (headers only: nothing is read)
    if args.ids is not None:
        ids = parse_ids(args.ids)
    else:
        ids = np.asarray([tokenize(directory, args.prompt if args.prompt is not None else "Hello")])
    SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)
    prepare_prompts(ids, spec, args.max_new_tokens)
    if args.tp > 1:
        check_tp_degree(spec, args.tp)
    check_ep_degree(spec, args.ep)  # a dense model is refused here, naming why
    prepare_environment(args.kernels, args.tp * args.ep if args.backend != "torch" else 1)  # JAX's devices only
    decode = make_decoder(directory)
    backends = ("torch", "jax") if args.backend == "both" else (args.backend,)
    results = {}
    for backend in backends:
        print(f"[{backend}] ", end="", flush=True)
        with allow_nonfinite_weights(args.allow_nonfinite):
            results[backend] = generate_with(backend, directory, ids, args, decode)
        gen = results[backend]
        print(
            f"\n[{backend}] {sum(map(len, gen.tokens))} tokens, prefill {gen.prefill_seconds:.2f}s, "
            f"decode {gen.decode_tokens_per_second:.1f} tokens/s",
            file=sys.stderr,
        )
    if len(results) == 2:
        return report_difference(results["torch"].tokens, results["jax"].tokens)
    return 0


def make_decoder(directory: Path):
    """ids -> text with the checkpoint's tokenizer, or ids as text when there is none."""
    path = Path(directory) / "tokenizer.json"
    if path.is_file():
        try:
            from tokenizers import Tokenizer
        except ImportError:
            return _ids_as_text
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as err:  # tokenizers raises a bare Exception for a malformed file
            raise InputError(f"{path} is not a valid tokenizer.json: {err}") from err
        return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False)
    return _ids_as_text


def _ids_as_text(ids) -> str:
    return " " + " ".join(str(i) for i in ids)


class TextStream:
    """The `stream` callback of generate: prints the first row's text as its tokens arrive.

    Byte-level tokens can end inside a UTF-8 character, which decodes to U+FFFD until the rest arrives, so
    trailing replacement characters are held back; `finish` prints whatever is still held (a character the
    generation really cut off).
    """

    def __init__(self, decode, out=None):
        self.decode, self.out = decode, out if out is not None else sys.stdout
        self.ids: list[int] = []
        self.printed = ""

    def __call__(self, step: int, tokens: np.ndarray) -> None:
        self.ids.append(int(tokens[0]))
        self._emit(self.decode(self.ids).rstrip(_REPLACEMENT))

    def finish(self) -> None:
        self._emit(self.decode(self.ids))

    def _emit(self, text: str) -> None:
        if len(text) > len(self.printed):  # decoders only extend the text (a respelled prefix prints once)
            self.out.write(text[len(self.printed) :])
            self.out.flush()
            self.printed = text


def generate_with(backend: str, directory: Path, ids: np.ndarray, args: argparse.Namespace, decode):
    kwargs = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    if args.no_eos:
        kwargs["eos_token_ids"] = ()
    stream = TextStream(decode)  # first row streams; all rows are returned
    if backend == "torch":
        import torch_impl

        if args.tp > 1 or args.ep > 1:  # ranks run in their own processes: tokens are printed once rank 0 returns them
            from torch_impl.tp_launch import launch_generate

            if args.ep > 1:
                kwargs["ep"] = args.ep
            gen = launch_generate(directory, ids, args.max_new_tokens, args.tp, dtype=args.dtype, **kwargs)
            sys.stdout.write(decode(gen.tokens[0]))
            return gen
        model = torch_impl.from_pretrained(directory, args.dtype, kernels=args.kernels, progress=True)
        gen = torch_impl.generate(model, ids, args.max_new_tokens, stream=stream, **kwargs)
        stream.finish()
        return gen
    import jax_impl

    mesh = None
    if args.tp > 1 or args.ep > 1:
        from jax_impl.tensor_parallel import make_mesh

        mesh = make_mesh(args.tp, **({"ep": args.ep} if args.ep > 1 else {}))
    model = jax_impl.from_pretrained(directory, args.dtype, kernels=args.kernels, progress=True, mesh=mesh)
    gen = jax_impl.generate(model, ids, args.max_new_tokens, stream=stream, mesh=mesh, **kwargs)
    stream.finish()
    return gen


def report_difference(torch_tokens: list[list[int]], jax_tokens: list[list[int]]) -> int:
    for row, (a, b) in enumerate(zip(torch_tokens, jax_tokens, strict=True)):
        for step in range(max(len(a), len(b))):
            ta = a[step] if step < len(a) else None
            tb = b[step] if step < len(b) else None
            if ta != tb:
                print(f"torch and jax differ at row {row}, step {step}: torch {ta}, jax {tb}")
                return 1
    print(f"torch and jax generated identical tokens ({sum(map(len, torch_tokens))} in all)")
    return 0
