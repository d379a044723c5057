#!/usr/bin/env bash
# expertctl inspect --json on the four real GGUF files; expected values read by hand from the
# files' bytes per gguf.md (and PROVENANCE.txt), not from expertctl.
set -euo pipefail
ctl=$1 dir=$2
check() {  # file tensor_count kv_count data_offset first_tensor first_type first_ne first_offset
  "$ctl" inspect "$dir/$1" --json | python3 -c "
import json, sys
j = json.load(sys.stdin)
got = (j['tensor_count'], j['kv_count'], j['version'], j['alignment'])
assert got == ($2, $3, 3, 32), got
if $2:
    assert j['data_offset'] == $4, j['data_offset']
    t = j['tensors'][0]
    assert (t['name'], t['type'], t['ne'], t['offset']) == ('$5', '$6', $7, $8), t
assert j['moe'] is None
print('$1: ok')"
}
check ollama__llama-2-tiny-random.gguf 12 18 724416 token_embd.weight f16 "[8, 32000]" 724416
check llamacpp__ggml-vocab-llama-spm.gguf 0 22 0 - - "[]" 0
check llamacpp__ggml-vocab-bert-bge.gguf 0 20 0 - - "[]" 0
check llamacpp__ggml-vocab-gpt-2.gguf 0 16 0 - - "[]" 0
"$ctl" inspect "$dir/llamacpp__ggml-vocab-gpt-2.gguf" | grep -q 'tokenizer.ggml.merges .*\[string x 50000\]'
echo "real files: OK"
