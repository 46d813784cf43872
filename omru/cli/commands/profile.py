"""`omru profile --model M --dataset D [--gpus 1,2,4] [--full-epoch] [--json] [--csv FILE]`:
measure a job's epoch time on 1, 2, 4, ... GPUs of a running cluster.

The profiler has the cluster's planner run short trials on its executors
(or serves a stored profile; --refresh measures again), fits the counts it did
not measure and says which points are measured. --csv writes the profile in
the `omru simulate` format (job,epochs,gpus,epoch_seconds).
"""

from __future__ import annotations

import argparse

from omru.cli import plannerargs

PROFILER_ENV = "OMRU_PROFILER"


def register(subparsers) -> None:
    p = subparsers.add_parser("profile", help="measure a job's epoch time on 1, 2, 4, ... GPUs", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="model of the zoo (for example resnet18)")
    p.add_argument("--dataset", required=True, help="digits, synthetic, imagefolder:<dir> or clips:<dir>")
    p.add_argument("--gpus", default="", help="GPU counts to measure, comma-separated (default: 1, 2, 4, ... up to the cluster's)")
    p.add_argument("--max-gpus", type=int, default=0, help="largest GPU count the profile covers (default: the largest of --gpus, else the cluster's)")
    p.add_argument("--batch-size", type=int, default=32, help="mini-batch per GPU (default 32)")
    p.add_argument("--image-size", type=int, default=32, help="input side in pixels (default 32)")
    p.add_argument("--frames", type=int, default=0, help="frames per clip (video models)")
    p.add_argument("--num-classes", type=int, default=0, help="classes (default: from the data set)")
    p.add_argument("--train-samples", type=int, default=0, help="samples per epoch (default: the whole training split)")
    p.add_argument("--epochs", type=int, default=1, help="epochs written to the --csv rows (default 1)")
    p.add_argument("--job", default="profile", help="job name of the --csv rows and of the trials (default 'profile')")
    p.add_argument("--full-epoch", action="store_true", help="time whole epochs instead of sampled iterations")
    p.add_argument("--refresh", action="store_true", help="measure again even when a stored profile exists")
    p.add_argument("--json", action="store_true", help="print the profile as JSON")
    p.add_argument("--csv", metavar="FILE", help="write job,epochs,gpus,epoch_seconds rows to FILE")
    p.add_argument("--profiler", default=None,
                   help=f"profiler address host:port (default ${PROFILER_ENV}, else the context `omru up` wrote)")
    plannerargs.add_token(p)
    plannerargs.add_tls(p)
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for the whole profile (default 1800)")
    p.set_defaults(func=handle)


def _counts(text: str) -> list[int]:
    from omru.cli.main import CliError

    counts = []
    for part in filter(None, (s.strip() for s in text.split(","))):
        if not part.isdigit() or int(part) < 1:
            raise CliError(f"--gpus {text!r}: {part!r} is not a GPU count >= 1")
        counts.append(int(part))
    return counts


def csv_rows(job: str, epochs: int, profile) -> str:
    """The `omru simulate` CSV of one profile."""
    lines = ["job,epochs,gpus,epoch_seconds"]
    lines += [f"{job},{epochs},{p.gpus},{p.epoch_seconds:.6f}" for p in profile.points]
    return "\n".join(lines) + "\n"


def handle(args) -> int:
    import asyncio
    import json
    import sys

    from omru.cli.main import CliError

    counts = _counts(args.gpus)
    if args.epochs < 1:
        raise CliError(f"--epochs {args.epochs} is below 1")
    conn = plannerargs.connection(args, "profiler")
    address, tls = conn.address, plannerargs.tls_of(conn)

    async def run():
        import grpc
        from google.protobuf.json_format import MessageToDict

        from omru.cli.errors import from_rpc
        from omru.v1 import common_pb2, profiler_pb2, profiler_pb2_grpc
        from services.common.channels import open_channel

        job = common_pb2.JobSpec(job_id=args.job, model=args.model, dataset=args.dataset, epochs=1, batch_size=args.batch_size,
                                 base_lr=0.1, image_size=args.image_size, frames=args.frames, num_classes=args.num_classes,
                                 train_samples=args.train_samples)
        request = profiler_pb2.ProfileRequest(job=job, gpu_counts=counts, max_gpus=args.max_gpus, full_epoch=args.full_epoch,
                                              refresh=args.refresh)
        names = profiler_pb2.ProfileState.Name
        async with open_channel(address, token=conn.token, tls=tls) as channel:
            stub = profiler_pb2_grpc.ProfilerServiceStub(channel)
            final = None
            try:
                async for reply in stub.Profile(request, timeout=args.timeout):
                    p = reply.progress
                    if not args.json:
                        what = f" {p.epoch_seconds:.3f} s/epoch" if p.state == profiler_pb2.PROFILE_STATE_MEASURED else ""
                        print(f"{names(p.state).removeprefix('PROFILE_STATE_').lower():9} {p.gpus} GPUs{what} {p.message}".rstrip(),
                              file=sys.stderr)
                    final = p
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    raise CliError(f"profiler said INVALID_ARGUMENT: {exc.details()}") from None
                if final is None and (gone := from_rpc(exc)) is not None:  # never reached it
                    raise gone from None
                raise RuntimeError(f"profiler at {address} said {exc.code().name}: {exc.details()}") from None
        if final is None or final.state != profiler_pb2.PROFILE_STATE_DONE:
            raise RuntimeError(final.message if final is not None else "the profiler ended without a result")
        return final, MessageToDict(final.profile, preserving_proto_field_name=True)

    try:
        final, as_dict = asyncio.run(run())
    except RuntimeError as exc:
        print(f"omru profile: profiling failed: {exc}", file=sys.stderr)
        return 1
    profile = final.profile
    if args.json:
        print(json.dumps({"cached": final.cached, **as_dict}, indent=2))
    else:
        k = profile.key
        print(f"{k.model} {k.input_shape} batch {k.batch_size} on {k.gpu_kind} ({k.nodes} node(s), {k.dataset}, "
              f"{'full epochs' if k.full_epoch else 'sampled iterations'}){' [stored]' if final.cached else ''}")
        print(f"{'gpus':>5} {'epoch_s':>10}  source")
        for p in profile.points:
            print(f"{p.gpus:>5} {p.epoch_seconds:>10.3f}  {'measured' if p.measured else 'fitted'}")
        f = profile.fit
        print(f"fit t(g) = {f.a:.3f} + {f.b:.3f}/g + {f.c:.3f}(g-1), max error on measured points {profile.fit_error:.1%}")
    if args.csv:
        try:
            with open(args.csv, "w") as out:
                out.write(csv_rows(args.job, args.epochs, profile))
        except OSError as exc:
            raise CliError(f"--csv {args.csv!r} cannot be written: {exc.strerror}") from None
    return 0
