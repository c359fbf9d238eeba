"""Spec-Bench's speed-up and mean accepted tokens, as its authors compute them.

Source: hemingkx/Spec-Bench, ``evaluation/speed.py`` (Apache-2.0), the function ``speed`` as published
with only its report printing removed. Kept verbatim (its two file-reading loops included) so that
``tests/test_specbench.py`` checks our export against Spec-Bench's own code, not a rewrite of it.
"""

import json

import numpy as np
from transformers import AutoTokenizer  # the module's imports, at its top as in speed.py


# ---- hemingkx/Spec-Bench evaluation/speed.py (Apache-2.0), `speed` as published, report printing removed
def speed(jsonl_file, jsonl_file_base, tokenizer, task=None, report=True):
    tokenizer = AutoTokenizer.from_pretrained(tokenizer)
    mt_bench_list = ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"]

    data = []
    with open(jsonl_file, "r", encoding="utf-8") as file:
        for line in file:
            json_obj = json.loads(line)
            if task == "overall":
                data.append(json_obj)
            elif task == "mt_bench":
                if json_obj["category"] in mt_bench_list:
                    data.append(json_obj)
            else:
                if json_obj["category"] == task:
                    data.append(json_obj)

    speeds = []
    accept_lengths_list = []
    for datapoint in data:
        tokens = sum(datapoint["choices"][0]["new_tokens"])
        times = sum(datapoint["choices"][0]["wall_time"])
        accept_lengths_list.extend(datapoint["choices"][0]["accept_lengths"])
        speeds.append(tokens / times)

    data = []
    with open(jsonl_file_base, "r", encoding="utf-8") as file:
        for line in file:
            json_obj = json.loads(line)
            if task == "overall":
                data.append(json_obj)
            elif task == "mt_bench":
                if json_obj["category"] in mt_bench_list:
                    data.append(json_obj)
            else:
                if json_obj["category"] == task:
                    data.append(json_obj)

    total_time = 0
    total_token = 0
    speeds0 = []
    for datapoint in data:
        answer = datapoint["choices"][0]["turns"]
        tokens = 0
        for i in answer:
            tokens += len(tokenizer(i).input_ids) - 1
        times = sum(datapoint["choices"][0]["wall_time"])
        speeds0.append(tokens / times)
        total_time += times
        total_token += tokens

    tokens_per_second = np.array(speeds).mean()
    tokens_per_second_baseline = np.array(speeds0).mean()
    speedup_ratio = np.array(speeds).mean() / np.array(speeds0).mean()
    return tokens_per_second, tokens_per_second_baseline, speedup_ratio, accept_lengths_list


# ---- end of Spec-Bench's code
