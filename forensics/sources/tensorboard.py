"""TensorBoard event files (`events.out.tfevents.*`): what verl's `tensorboard` logger, torch's SummaryWriter,
Lightning's and Hugging Face's TensorBoard callbacks write.

Read with the field's reader, the `tensorboard` package's event file loader (an optional extra:
`pip install forensics[tensorboard]`); without it the file is listed with a note saying so. Scalars are
`simple_value` (float32, so less precise than a JSONL or console copy of the same metric) or scalar tensors.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from forensics.sources.base import FileResult, FileSource, Sink

SOURCE = "tensorboard"
MAX_EVENTS = 5_000_000


def _sniff(name: str, head: bytes) -> bool:
    return "tfevents" in name


def _tensor_scalar(tensor) -> float | None:  # a TensorProto
    if tensor.float_val:
        return float(tensor.float_val[0])
    if tensor.double_val:
        return float(tensor.double_val[0])
    if tensor.int64_val:
        return float(tensor.int64_val[0])
    if tensor.int_val:
        return float(tensor.int_val[0])
    if tensor.tensor_content and tensor.dtype in (1, 2):  # DT_FLOAT, DT_DOUBLE, one element
        import numpy as np

        values = np.frombuffer(tensor.tensor_content, dtype=np.float32 if tensor.dtype == 1 else np.float64)
        return float(values[0]) if values.size == 1 else None
    return None


def _read(path: Path, rel: str, sink: Sink) -> FileResult:
    result = FileResult()
    try:
        from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
        from tensorboard.compat.proto import event_pb2
    except ImportError:
        result.note = "TensorBoard event file: install the `tensorboard` package (forensics[tensorboard]) to read it"
        result.warnings.append(f"{rel}: {result.note}")
        return result
    count = 0
    try:
        for raw in RawEventFileLoader(str(path)).Load():
            count += 1
            if count > MAX_EVENTS:
                result.warnings.append(f"{rel}: only the first {MAX_EVENTS} events were read")
                break
            event = event_pb2.Event.FromString(raw)
            if not event.HasField("summary"):
                continue
            when = datetime.fromtimestamp(event.wall_time, timezone.utc) if event.wall_time > 0 else None
            for value in event.summary.value:
                kind = value.WhichOneof("value")
                number = float(value.simple_value) if kind == "simple_value" else None
                if kind == "tensor":
                    number = _tensor_scalar(value.tensor)
                if number is not None:
                    sink.sample(value.tag, number, source=SOURCE, step=event.step, ts=when)
    except Exception as exc:  # a truncated or damaged record ends the file: keep what came before
        result.warnings.append(f"{rel}: event file damaged after {count} events ({type(exc).__name__})")
    result.lines = count
    return result


FILE_SOURCES = [FileSource("tensorboard_events", _sniff, _read)]
