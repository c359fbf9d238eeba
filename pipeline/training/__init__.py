"""Training tools for the pipeline's own models (not part of a sweep; command lines in pipeline/*.py).

common.py        run setup (threads, seed, work folder, log), the frozen target, the heads' schedule
prompt_sets.py   the offline training prompts (templates, word lists, standard-library source)
chat_mix.py      the broad chat prompt mix (MT-Bench's categories, second turns) and its held-out split
chat_mix_words.py, chat_mix_subjects.py
                 the chat mix's word lists
contamination.py the check that refuses evaluation prompts in training data (word 13-grams)
teacher_data.py  the offline teacher data (one copy): the target's sampled answers and top-k
                 log-probs (draft distillation)
shards.py        the teacher data's shards on disk (.pt, or compact .npz), their manifest and checked loader
feature_corpus.py
                 the heads' feature corpus with the target's hidden states (Medusa, EAGLE)
distill.py       distil a small draft for a pair's target (``python -m pipeline.distill``)
distill_heldout.py
                 the held-out sets of a distillation run and the alpha measured on them
distill_train.py the distillation's training loop (token map, batches, KD loss)
gpu_teacher.py   the teacher data generated on a GPU node in bundles a device call brings back (jobs/gpu_teacher.sh)
medusa.py        train Medusa heads for a target (``python -m pipeline.train_medusa``)
eagle.py         train an EAGLE-1/2 head for a target (``python -m pipeline.train_eagle``)
eagle3.py        train an EAGLE-3 head with the authors' training-time test
                 (``python -m pipeline.train_eagle --config-name train_eagle3``)
drafter_alpha.py held-out first-token alpha of the draft and of the heads on the same positions
speed.py         tokens/s of the methods with a pair's draft on held-out prompts (``python -m pipeline.distill_speed``)
cards.py         the model cards written next to the checkpoints
"""
