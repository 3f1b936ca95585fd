"""Dataset work that needs the training stack, run BY PATH with the trainer's python (no tunedeck import).

Reads one JSON request on stdin and prints one line, MARK + a JSON answer ({"error": ...} when it
cannot):
- `{"op": "rows", "file": F, "limit": N}`: the columns and first N rows of a Parquet file (pyarrow).
- `{"op": "preview", "file": F, "entry": {dataset_info entry}, "model": M, "template": T,
  "cutoff_len": C, "rows": N}`: the first N rows converted by LLaMA-Factory's own dataset converter,
  encoded with its chat template for the model's tokenizer, decoded back to the text the model sees,
  with each row's token count against cutoff_len.
"""

import json
import os
import sys

MARK = "@@DATASET@@"


def _err(e):
    return f"{type(e).__name__}: {e}"[:800]


def _parquet_rows(path, limit):
    import pyarrow.parquet as pq

    f = pq.ParquetFile(path)
    rows = []
    for batch in f.iter_batches(batch_size=min(limit, 1024)):
        rows += batch.to_pylist()
        if len(rows) >= limit:
            break
    return {"columns": f.schema_arrow.names, "total": f.metadata.num_rows, "rows": rows[:limit]}


def _rows(path, limit):
    if path.endswith(".parquet"):
        return _parquet_rows(path, limit)["rows"]
    if path.endswith(".jsonl"):
        out = []
        with open(path, encoding="utf-8-sig") as fh:
            for line in fh:
                if line.strip():
                    out.append(json.loads(line))
                if len(out) >= limit:
                    break
        return out
    if path.endswith(".csv"):
        import csv

        with open(path, encoding="utf-8-sig", newline="") as fh:
            return [row for _, row in zip(range(limit), csv.DictReader(fh), strict=False)]
    with open(path, encoding="utf-8-sig") as fh:
        return json.load(fh)[:limit]


def preview(req):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from llamafactory.data.converter import get_dataset_converter
    from llamafactory.data.parser import DatasetAttr
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments
    from transformers import AutoTokenizer

    entry = req["entry"]
    attr = DatasetAttr("file", dataset_name=entry.get("file_name", "preview"))
    attr.join(entry)
    data_args = DataArguments(template=req["template"], cutoff_len=req["cutoff_len"])
    tokenizer = AutoTokenizer.from_pretrained(req["model"])
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    convert = get_dataset_converter(attr.formatting, attr, data_args)
    out = []
    for n, row in enumerate(_rows(req["file"], req["rows"]), 1):
        example = convert(row)
        messages = example["_prompt"] + example["_response"][:1]
        if not messages:
            out.append({"row": n, "error": "LLaMA-Factory skips this row (broken turns)"})
            continue
        pairs = template.encode_multiturn(
            tokenizer, messages, example["_system"] or None, example["_tools"] or None
        )
        ids = [t for prompt, response in pairs for t in (*prompt, *response)]
        target = sum(len(response) for _, response in pairs)
        out.append(
            {
                "row": n,
                "text": tokenizer.decode(ids, skip_special_tokens=False),
                "tokens": len(ids),
                "response_tokens": target,
                "over_cutoff": len(ids) > req["cutoff_len"],
            }
        )
    return {"rows": out, "template": req["template"]}


def main():
    try:
        req = json.loads(sys.stdin.read())
        if req["op"] == "rows":
            answer = _parquet_rows(req["file"], int(req["limit"]))
        elif req["op"] == "preview":
            answer = preview(req)
        else:
            answer = {"error": f"unknown op {req['op']!r}"}
    except Exception as e:  # the server shows what went wrong, whatever it was
        answer = {"error": _err(e)}
    print(MARK + json.dumps(answer, default=str), flush=True)


if __name__ == "__main__":
    main()
