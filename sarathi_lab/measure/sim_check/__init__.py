"""The simulator checked against the engine and against GPU measurements, in one place."""

# `python -m sarathi_lab.measure NAME` runs one (each also as
# `python -m sarathi_lab.measure.sim_check.NAME`).
CHECKS = {
    "sim_validate": "the simulator against the real engine on this machine: batches, iteration "
                    "times, latencies",
    "sim_speed": "how fast the simulator serves 10,000 requests, and where its time goes "
                 "(--profile)",
    "sim_process": "a simulated run as a whole process: the CPU seconds of `python -m "
                   "sarathi_lab.run executor=sim` over sim_speed's 4,096 requests (--against DIR "
                   "alternates another checkout's runs)",
    "sim_pipeline": "pipeline bubbles of Orca-style batching against SARATHI, GPT-3 on TP8 x PP8 "
                    "A100s (simulated): docs/sim/pipeline_*",
    "sim_fidelity": "the simulator's GPU cost models against GPU kernels measured on A100s and "
                    "H100s (vidur) and this engine's task=profile tables measured on a GPU",
    "sim_vs_gpu": "the simulator against the real engine's runs on a GPU (--runs ROOT --lease "
                  "LEASE): every run kind, errors per iteration kind and cost model, served "
                  "latencies, gains",
}
