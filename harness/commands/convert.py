"""``specsweep convert SRC DST``: turn an EAGLE3 draft into the layout SGLang loads, checked."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.commands.base import Command
from workers.convert.converter import ConvertOptions, convert
from workers.convert.eagle3_format import LayerNaming, SourceFormat
from workers.convert.report import ConversionReport
from workers.sglang.drafts import SGLANG_VERSION


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", metavar="SRC", type=Path, help="draft checkpoint directory to convert")
    parser.add_argument("dst", metavar="DST", type=Path, help="output directory (created atomically)")
    parser.add_argument(
        "--from",
        dest="source_format",
        choices=["auto", *SourceFormat],
        default="auto",
        help="input format (default auto: detected from config and keys, and reported)",
    )
    parser.add_argument(
        "--target-config",
        metavar="DIR",
        type=Path,
        help="target model directory (its config.json): check vocab, hidden size, aux layer ids",
    )
    parser.add_argument(
        "--layout",
        choices=list(LayerNaming),
        default=LayerNaming.MIDLAYER,
        help="draft layer keys: midlayer.* (default; old and new SGLang) or layers.0.* (new SGLang only)",
    )
    parser.add_argument(
        "--sglang-version",
        metavar="VERSION",
        default=SGLANG_VERSION,
        help=f"SGLang version the nodes run (default {SGLANG_VERSION}): features it cannot load are "
        "refused, naming the version that can",
    )
    parser.add_argument(
        "--allow-pickle",
        action="store_true",
        help="read .bin/.pt weights (pickle; loaded with torch weights_only=True)",
    )
    parser.add_argument(
        "--allow-external-shards",
        action="store_true",
        help="read weight files (index entries, symlinks) that resolve outside SRC",
    )
    parser.add_argument("--force", action="store_true", help="replace a DST that holds something else")
    parser.add_argument("--json", action="store_true", help="print the conversion report as JSON")


def _options(args: argparse.Namespace) -> ConvertOptions:
    return ConvertOptions(
        source_format=None if args.source_format == "auto" else SourceFormat(args.source_format),
        target_config=args.target_config,
        layout=LayerNaming(args.layout),
        sglang_version=args.sglang_version,
        allow_pickle=args.allow_pickle,
        allow_external_shards=args.allow_external_shards,
        force=args.force,
    )


def print_human(report: ConversionReport) -> None:
    """What happened, in a dozen lines: the format and why, checks, drops, where the output is.

    Plain print, not rich: this command's start-up time counts against its throughput.
    """
    if report.reused:
        print(
            f"{report.destination} already holds this conversion "
            f"(source xxh3 {report.source_digest[:16]}…): nothing to do"
        )
        return
    print(f"detected format: {report.source_format} ({report.detection})")
    for check in report.checks:
        print(f"  {check.status:4} {check.name}: {check.detail}")
    for dropped in report.dropped:
        print(f"  dropped {dropped.key}: {dropped.reason}")
    for change in report.config_changes:
        print(f"  config: {change}")
    head = "the draft's own" if report.lm_head == "draft" else "the target's (the draft has none)"
    print(f"  lm_head served: {head}")
    for need in report.needs:
        print(f"  needs SGLang >= {need.minimum_sglang}: {need.feature}")
    print(f"  loads in SGLang >= {report.minimum_sglang} (checked for {report.sglang_version})")
    mib = report.bytes_written / (1 << 20)
    rate = mib / report.seconds if report.seconds else 0.0
    print(
        f"wrote {len(report.tensors)} tensors ({mib:.1f} MiB, {rate:.0f} MiB/s) to "
        f"{report.destination}; details in conversion.json"
    )


def run(args: argparse.Namespace) -> int:
    from harness.progress import long_step

    with long_step(f"converting {args.src}", sys.stderr if args.json else sys.stdout):
        report = convert(args.src, args.dst, _options(args))
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        print_human(report)
    return 0


COMMAND = Command(
    name="convert",
    help="convert an EAGLE3 draft checkpoint to the layout SGLang loads, with every check",
    add_arguments=add_arguments,
    run=run,
    description=(
        "Convert a speculators, SGLang-native or original-EAGLE EAGLE3 draft into a directory SGLang "
        "loads as --speculative-draft-model-path. Refuses anything it cannot map exactly; writes "
        "conversion.json with the key mapping, hashes and every check. Re-running is a no-op."
    ),
)
