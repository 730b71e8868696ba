"""What a run measures beside its loss, logged through fairseq's metrics: the forgetting meter
(``--forgetting-probe``, forgetting_meter.py), BLEU at θ* (``--eval-bleu-start``, bleu_start.py), ‖θ − θ*‖² where
no optimizer or term logs it (theta_distance.py); measuring.py: how they measure without changing training."""
