"""Training dynamics: detectors over the metric series (loss, RL signals, memory, throughput, progress)."""
