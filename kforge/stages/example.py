"""Stage `example`: a platform's one-shot example and whether it can run on this host."""

from __future__ import annotations

from pathlib import Path

from kforge.platforms import get_platform
from kforge.platforms.base import load_example
from kforge.schema import PlatformInfo, Record
from kforge.stages.context import StageContext, write_record


class ExampleRecord(Record):
    platform: str
    info: PlatformInfo
    example: str | None  # blob digest of the OneShotExample JSON
    error: str | None = None


def run_example(ctx: StageContext, platform: str, out: Path) -> ExampleRecord:
    info = get_platform(platform).describe()
    try:
        example = load_example(platform)
        record = ExampleRecord(platform=platform, info=info, example=ctx.store.put_json(example))
    except FileNotFoundError as err:
        record = ExampleRecord(platform=platform, info=info, example=None, error=str(err))
    write_record(out, record, ctx.store)
    return record
