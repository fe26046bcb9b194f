"""Stage `compile`: build the kernels a candidate embeds, without running the candidate."""

from __future__ import annotations

import os
from pathlib import Path

from kforge.agents.prompting import truncate
from kforge.platforms import get_platform
from kforge.stages.context import StageContext, write_record
from kforge.stages.records import NO_CANDIDATE_MARK, CompileRecord
from kforge.store import sha256_bytes

LOG_CHARS = 8000


def run_compile(ctx: StageContext, *, platform: str, kernel: Path, out: Path) -> CompileRecord:
    text = kernel.read_text()
    if text.startswith(NO_CANDIDATE_MARK):
        record = CompileRecord(
            platform=platform, source=None, ok=False, reason="no_candidate", log=ctx.store.put_text(text), seconds=0.0
        )
        write_record(out, record, ctx.store)
        return record
    source = sha256_bytes(text.encode())
    adapter = get_platform(platform)
    info = adapter.describe()
    key = ctx.action_key("compile", platform=platform, source=source, info=info.model_dump(mode="json"))
    cached = ctx.cached(key, CompileRecord)
    built = getattr(adapter, "built", None)
    if cached is not None and cached.ok and built is not None and not built(text, ctx.build_dir.resolve()):
        # A hit from a store shared with another host or workdir whose build folder is not
        # this one (tests/test_store_concurrent.py, a cluster with node-local build folders):
        # the record stands, the library must exist here too, or the verifier cannot load it.
        ctx.build_dir.mkdir(parents=True, exist_ok=True)
        os.environ["KFORGE_BUILD_DIR"] = str(ctx.build_dir.resolve())
        rebuilt = adapter.build(text, ctx.build_dir.resolve())
        ctx.ledger("build", platform=platform, source=source, ok=rebuilt.ok)
        if not rebuilt.ok:
            cached = None  # not reproducible here: record what this host's compiler says
    if cached is not None:
        write_record(out, cached, ctx.store)
        return cached
    if not info.can_build:
        record = CompileRecord(
            platform=platform, source=source, ok=False, reason="platform_unavailable",
            log=ctx.store.put_text(info.reason), seconds=0.0,
        )
    else:
        # Built kernels land in the store's build folder, where the sandboxed verifier and
        # profiler load them read-only (adapters write there atomically, keyed by digest).
        ctx.build_dir.mkdir(parents=True, exist_ok=True)
        os.environ["KFORGE_BUILD_DIR"] = str(ctx.build_dir.resolve())
        result = adapter.build(text, ctx.build_dir.resolve())
        ctx.ledger("build", platform=platform, source=source, ok=result.ok)
        record = CompileRecord(
            platform=platform,
            source=source,
            ok=result.ok,
            reason="ok" if result.ok else "compile_error",
            log=ctx.store.put_text(truncate(result.log, LOG_CHARS)),
            seconds=round(result.seconds, 3),
            tool_versions=result.tool_versions,
        )
    ctx.remember(key, record, [record.log])
    write_record(out, record, ctx.store)
    return record
