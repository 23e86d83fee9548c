"""The web front door: `ckpt-repair serve` and the Hugging Face Space (the top layer; nothing imports it).

The page only wires widgets to the library; doctor and every fix run in worker processes (worker.py),
fixes as jobs that outlive the browser (jobs.py). Needs the `web` extra (gradio).
"""
