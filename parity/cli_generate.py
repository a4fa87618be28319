"""`decoder-parity generate [CHECKPOINT_DIR]`: greedy or sampled generation with either backend, or both.

Tokens stream to stdout as they are produced (decoded with the checkpoint's tokenizer.json when present,
else as ids); tokens/s goes to stderr at the end. `--backend both` runs torch_impl then jax_impl on the
same request and reports the first step where they differ. `--tp N` runs the tensor-parallel path (JAX on
N simulated CPU devices; torch on N gloo processes).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from parity.environment import prepare_environment
from parity.inputs import parse_ids, tokenize
from spec import InputError, ModelSpec, default_checkpoint


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("generate", help="generate tokens with torch_impl, jax_impl, or both")
    p.add_argument("checkpoint", nargs="?", type=Path, help="Hugging Face checkpoint dir (default: built-in)")
    p.add_argument("--backend", choices=("torch", "jax", "both"), default="torch")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--prompt", help="text, tokenized with the checkpoint's tokenizer.json")
    source.add_argument("--ids", help="token ids, e.g. '1,2,3' (rows separated by ';')")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    p.add_argument("--kernels", choices=("reference", "fused", "auto"), default="reference")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-eos", action="store_true", help="ignore the checkpoint's EOS ids")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (simulated devices on CPU)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    directory = args.checkpoint if args.checkpoint is not None else default_checkpoint()
    if not Path(directory).is_dir():
        raise InputError(f"checkpoint directory {directory} does not exist")
    ModelSpec.from_pretrained(directory)  # an unsupported config fails here, before anything loads
    if args.ids is not None:
        ids = parse_ids(args.ids)
    else:
        ids = np.asarray([tokenize(directory, args.prompt if args.prompt is not None else "Hello")])
    prepare_environment(args.kernels, args.tp)
    decode = make_decoder(directory)
    backends = ("torch", "jax") if args.backend == "both" else (args.backend,)
    results = {}
    for backend in backends:
        print(f"[{backend}] ", end="", flush=True)
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

            tokenizer = Tokenizer.from_file(str(path))
            return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False)
        except ImportError:
            pass
    return lambda ids: " " + " ".join(str(i) for i in ids)


def generate_with(backend: str, directory: Path, ids: np.ndarray, args: argparse.Namespace, decode):
    kwargs = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    if args.no_eos:
        kwargs["eos_token_ids"] = ()
    shown: list[int] = []

    def stream(step: int, tokens: np.ndarray) -> None:  # first row streams; all rows are returned
        shown.append(int(tokens[0]))
        text = decode(shown)
        sys.stdout.write(text[len(stream.printed) :] if text.startswith(stream.printed) else f" {tokens[0]}")
        stream.printed = text
        sys.stdout.flush()

    stream.printed = ""
    if backend == "torch":
        import torch_impl

        if args.tp > 1:  # ranks run in their own processes: tokens are printed once rank 0 returns them
            from torch_impl.tp_launch import launch_generate

            gen = launch_generate(directory, ids, args.max_new_tokens, args.tp, dtype=args.dtype, **kwargs)
            sys.stdout.write(decode(gen.tokens[0]))
            return gen
        model = torch_impl.from_pretrained(directory, args.dtype, kernels=args.kernels, progress=True)
        return torch_impl.generate(model, ids, args.max_new_tokens, stream=stream, **kwargs)
    import jax_impl

    mesh = None
    if args.tp > 1:
        from jax_impl.tensor_parallel import make_mesh

        mesh = make_mesh(args.tp)
    model = jax_impl.from_pretrained(directory, args.dtype, kernels=args.kernels, progress=True, mesh=mesh)
    return jax_impl.generate(model, ids, args.max_new_tokens, stream=stream, mesh=mesh, **kwargs)


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
