"""The engine against transformers: equal greedy tokens (float32) under every scheduler, backend."""
from __future__ import annotations

from sarathi_lab.engine.scheduler import scheduler_names
from sarathi_lab.measure.gpu.context import Context
from sarathi_lab.measure.gpu.engine_code import ENGINE
from sarathi_lab.measure.gpu.state import Metric
from sarathi_lab.measure.gpu.steps import Declared

STEP = Declared(
    order=60, minutes=0.9, paths=ENGINE,
    what="greedy tokens vs transformers on CUDA, fp32, Llama/Mistral/Qwen2 x 5 "
         "schedulers x attention triton and torch; bf16 first tokens; overlap=nano_batch's tokens "
         "vs none's, its cut batches replayed from the engine's cut graphs")

ARCHITECTURES = ("llama", "mistral", "qwen2")
PROMPT_LENS = (37, 5, 16, 61, 1)
NEW_TOKENS = 9
CHUNK = 16       # divides the block size and splits the longer prompts
# Their second iteration (the rest of one prompt and the start of the next, 398 tokens beside two
# decodes) is one overlap=nano_batch cuts, within the models' 512 positions.
OVERLAP_PROMPT_LENS, OVERLAP_CHUNK = (5, 16, 480, 470), 400


def first_difference(got: list[list[int]], want: list[list[int]]) -> str:
    for i, (g, w) in enumerate(zip(got, want)):
        j = next((k for k, (a, b) in enumerate(zip(g, w)) if a != b), None)
        if j is not None:
            return f"prompt {i} token {j}: {g[j]} vs {w[j]}"
    return ""


def run(ctx: Context, step) -> tuple[list[Metric], list[str]]:
    import torch
    from tests.hf_models import hf_greedy, save_random_model

    from sarathi_lab import LLM

    backends = ("triton", "torch") if ctx.device == "cuda" else ("torch",)
    # The dry run checks this step's code: one architecture, no Triton (minutes interpreted).
    architectures = ARCHITECTURES[:1] if ctx.dry_run else ARCHITECTURES
    metrics, notes = [], []
    if ctx.dry_run:
        notes.append(f"dry run: {architectures[0]} only, attention=torch only")
    for arch in architectures:
        directory = ctx.dir / arch
        model = save_random_model(arch, directory).to(ctx.device)
        gen = torch.Generator().manual_seed(1)
        prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=gen).tolist()
                   for n in PROMPT_LENS]
        want = [hf_greedy(model, p, NEW_TOKENS) for p in prompts]
        for backend in backends:
            for scheduler in scheduler_names():
                llm = LLM(model=str(directory), scheduler=scheduler, chunk_size=CHUNK,
                          max_batch_size=3,
                          device=ctx.device, dtype="float32", attention=backend, warmup_iters=0)
                got = llm.generate(prompts, max_new_tokens=NEW_TOKENS)
                metrics.append(Metric(f"greedy_equal_fp32[{arch},{backend},{scheduler}]",
                                      got == want))
                if got != want:
                    notes.append(f"{arch} {backend} {scheduler}: {first_difference(got, want)}")
        if arch == "llama":
            m, n = overlap_checks(ctx, directory, model.config.vocab_size)
            metrics, notes = metrics + m, notes + n
        model = model.to(torch.bfloat16)
        want16 = [hf_greedy(model, p, NEW_TOKENS) for p in prompts]
        for backend in backends:
            llm = LLM(model=str(directory), scheduler="sarathi", chunk_size=CHUNK, max_batch_size=3,
                      device=ctx.device, dtype="bfloat16", attention=backend, warmup_iters=0)
            got16 = llm.generate(prompts, max_new_tokens=NEW_TOKENS)
            agree = sum(g[0] == w[0] for g, w in zip(got16, want16))
            metrics.append(Metric(f"first_token_agree_bf16[{arch},{backend}]",
                                  agree / len(prompts)))
    return [*summarise(metrics, "greedy_equal_fp32", "runs equal"),
            *summarise(metrics, "first_token_agree_bf16", "runs with every first token equal"),
            *metrics], notes


def overlap_checks(ctx: Context, directory, vocab: int) -> tuple[list[Metric], list[str]]:
    """overlap=nano_batch against none: equal greedy tokens; cut batches replayed from graphs."""
    import torch

    from sarathi_lab import LLM

    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in OVERLAP_PROMPT_LENS]
    backend = "triton" if ctx.device == "cuda" else "torch"
    tokens, cut, replayed = {}, [], []
    for overlap in ("none", "nano_batch"):
        llm = LLM(model=str(directory), scheduler="sarathi", chunk_size=OVERLAP_CHUNK,
                  max_batch_size=4, device=ctx.device, dtype="float32", attention=backend,
                  warmup_iters=0, overlap=overlap)
        runner, graphs = llm.engine.executor.runner, llm.engine.executor.graphs
        prepare = runner.prepare
        runner.prepare = lambda batch, prepare=prepare: _kept(prepare(batch), cut)
        if graphs is not None:
            replay = graphs.replay
            graphs.replay = lambda p, g, replay=replay: _kept(replay(p, g), replayed, g.cut)
        tokens[overlap] = llm.generate(prompts, max_new_tokens=NEW_TOKENS)
    cuts = sum(p.nano is not None for p in cut)
    replays = sum(1 for c in replayed if c)
    equal = tokens["none"] == tokens["nano_batch"]
    note = (f"overlap: prompts {OVERLAP_PROMPT_LENS}, chunk {OVERLAP_CHUNK}, {backend}: {cuts} "
            f"batches cut, {replays} replayed from cut graphs")
    return [Metric(f"overlap_tokens_equal[llama,{backend},sarathi]", int(equal), "", "1", equal),
            Metric("overlap_cut_batches[llama]", cuts, "", "> 0", cuts > 0),
            Metric("nano_graph_replays[llama]", replays, "", f"{cuts}",
                   replays == cuts if ctx.device == "cuda" else None)], [note]


def _kept(value, into: list, what=None):
    into.append(value if what is None else what)
    return value


def summarise(metrics: list[Metric], prefix: str, what: str) -> list[Metric]:
    """How many runs passed, one line with a target for the table."""
    cases = [m for m in metrics if m.metric.startswith(prefix)]
    passed = sum(m.value in (True, 1.0) for m in cases)
    return [Metric(f"{prefix}_all", f"{passed}/{len(cases)}", what, "all", passed == len(cases))]
