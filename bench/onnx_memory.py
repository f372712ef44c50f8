"""ONNX conversion memory, side by side: the weights traced as graph inputs (what export-bundle and
`conv2tflite --format onnx` do) against the weights traced as constants (tf2onnx's own road), per model row.

    python bench/onnx_memory.py [--rows resnet_small,resnet_custom_v4,resnet_152] [--cap-mb 12000]

Each road runs in a child process of its own; its peak resident memory is sampled every 0.1 s and a child past
--cap-mb is stopped (the machine is shared), reported as "over". Both roads convert the model alone (one input,
its outputs) and are checked against Keras on the same inputs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROADS = ("inputs", "constants")


def child(name: str, road: str) -> None:
    sys.path.insert(0, str(ROOT))
    import numpy as np

    from deepdanbooru.inference.convert import sample_inputs
    from deepdanbooru.inference.onnx_graph import ONNX_OPSET, run_onnx, to_onnx
    from deepdanbooru.models import build_model, minimum_input_size

    size = max(32, minimum_input_size(name))
    model = build_model(name, (size, size, 3), 5, seed=1)
    started = time.perf_counter()
    if road == "inputs":
        content = to_onnx(model)
    else:
        import tensorflow as tf
        import tf2onnx

        signature = (tf.TensorSpec((None, size, size, 3), tf.float32, name="image"),)
        function = tf.function(lambda image: model(image, training=False), input_signature=signature)
        proto, _ = tf2onnx.convert.from_function(function, input_signature=signature, opset=ONNX_OPSET)
        content = proto.SerializeToString()
    seconds = time.perf_counter() - started
    images = sample_inputs(size, size)
    difference = float(np.max(np.abs(run_onnx(content, images) - np.asarray(model(images, training=False)))))
    print(json.dumps({"seconds": seconds, "bytes": len(content), "difference": difference, "size": size}))


def resident_mb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 0


def measure(name: str, road: str, cap_mb: int) -> dict:
    process = subprocess.Popen([sys.executable, __file__, "--child", name, road], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    peak, stopped = 0, False
    while process.poll() is None:
        peak = max(peak, resident_mb(process.pid))
        if peak > cap_mb:
            process.kill()
            stopped = True
        time.sleep(0.1)
    output = process.stdout.read().strip().splitlines()
    result = json.loads(output[-1]) if process.returncode == 0 and output else {}
    return {"peak_mb": peak, "stopped": stopped, "failed": not stopped and not result, **result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="resnet_small,resnet_custom_v4,resnet_152")
    parser.add_argument("--cap-mb", type=int, default=12000)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    print(f"{'row':<18} {'road':<10} {'peak MB':>8} {'seconds':>8} {'difference':>10}")
    for name in args.rows.split(","):
        results = {road: measure(name, road, args.cap_mb) for road in ROADS}
        for road, result in results.items():
            if result["stopped"]:
                peak, seconds, difference = f">{args.cap_mb}", "over", "-"
            elif result["failed"]:
                peak, seconds, difference = str(result["peak_mb"]), "failed", "-"
            else:
                peak, seconds = str(result["peak_mb"]), f"{result['seconds']:.1f}"
                difference = f"{result['difference']:.2g}"
            print(f"{name:<18} {road:<10} {peak:>8} {seconds:>8} {difference:>10}")
        inputs, constants = results["inputs"], results["constants"]
        bound = "at least " if constants["stopped"] else ""
        print(f"{name:<18} constants / inputs peak memory: {bound}{constants['peak_mb'] / inputs['peak_mb']:.1f}x",
              flush=True)


if __name__ == "__main__":
    main()
