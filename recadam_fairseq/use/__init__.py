"""Use a fine-tuned model: label sentences with a run (``predict``) or write a multi-task checkpoint's GLUE test-set
submission (``predict_multitask``), export a classifier to Hugging Face (``export_hf``), merge a LoRA checkpoint into
plain weights (``merge_lora``), mix a run's weights with the pretrained ones (WiSE-FT: ``interpolate``). Their command
lines are scripts/glue/predict.py, scripts/glue/predict_multitask.py, scripts/export_hf.py, scripts/merge_lora.py and
scripts/interpolate.py; never imported by the plug-in."""
