"""Training jobs shipped with Weaver (implementations of `agent.job.TrainingJob`).

    agent.jobs.chargpt:make_job        the char-level GPT on the Shakespeare slice (the default job)
    agent.jobs.hf_causal_lm:make_job   a Hugging Face transformers causal LM from a config, optional peft LoRA
"""
