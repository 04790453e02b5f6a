"""How a worker generates an LLM job's prompts: one backend per engine, picked by the job's `--backend` name.

base.py is what a backend tells the rest of the kind (how a worker loads and generates, whether its batches
are padded, which context it runs a model with, whether it is installed here); registry.py finds one by its
name. transformers.py and vllm.py are the two that ship (vllm_engine.py: vLLM's engine inside a worker).
Only a worker's batch imports a backend's engine, torch and its models included.
"""
