// The form's fields, grouped like the seed's train YAML. Anything else lives in "Other keys".
// kind: text | int | float | bool (a three-way select: unset, true, false) | a list of choices.

export const GROUPS = [
  ["Model", [
    ["model_name_or_path", "text", "path in the workspace, or a hub id in the server's HF cache"],
    ["template", "text"],
    ["trust_remote_code", "bool"],
  ]],
  ["Method", [
    ["stage", ["sft", "pt", "rm", "ppo", "dpo", "kto"]],
    ["do_train", "bool"],
    ["finetuning_type", ["lora", "freeze", "full"]],
    ["lora_target", "text", "all, or module names"],
    ["lora_rank", "int"],
    ["lora_alpha", "int"],
    ["lora_dropout", "float"],
  ]],
  ["Dataset", [
    ["dataset", "text", "names from dataset_info.json, comma-separated"],
    ["dataset_dir", "text"],
    ["cutoff_len", "int"],
    ["max_samples", "int"],
    ["overwrite_cache", "bool"],
    ["preprocessing_num_workers", "int"],
  ]],
  ["Output", [
    ["logging_steps", "int"],
    ["save_steps", "int"],
    ["plot_loss", "bool"],
    ["report_to", "text"],
  ]],
  ["Train", [
    ["per_device_train_batch_size", "int"],
    ["gradient_accumulation_steps", "int"],
    ["learning_rate", "float"],
    ["num_train_epochs", "float"],
    ["max_steps", "int"],
    ["lr_scheduler_type", ["linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup"]],
    ["warmup_ratio", "float"],
    ["warmup_steps", "int"],
    ["bf16", "bool"],
    ["fp16", "bool"],
    ["gradient_checkpointing", "bool"],
    ["ddp_timeout", "int"],
  ]],
  ["Eval", [
    ["val_size", "float"],
    ["per_device_eval_batch_size", "int"],
    ["eval_strategy", ["no", "steps", "epoch"]],
    ["eval_steps", "int"],
  ]],
];

export const KINDS = Object.fromEntries(GROUPS.flatMap(([, fields]) => fields.map(([k, kind]) => [k, kind])));
