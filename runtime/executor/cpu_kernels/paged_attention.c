// Paged attention on the CPU (fp32) for decodes and short spans (a speculative verify span, a short
// chunk): K/V read in place through the block table (no gathered copy). One task per (sequence,
// KV head): the span's query rows and the `group` query heads sharing that KV head read each K/V
// row once. Two passes over the context (scores, then the weighted sum of V) with an exact
// max-subtracted softmax; row r of a span of n rows over a context of len sees keys 0..len-n+r.
//
// Layout (runtime/executor/attention): q, out [T, H, D]; caches [num_blocks, block_size, KVH, D];
// block_tables [S, width] int32; seq_lens [S] int32. The tasks' sequences: seq_ids[i] (a row of
// block_tables / seq_lens), its query rows q_starts[i] .. q_starts[i] + q_lens[i] of q and out.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

void paged_attention_f32(const float *q, const float *k_cache, const float *v_cache, const int32_t *block_tables,
                         const int32_t *seq_lens, const int32_t *seq_ids, const int32_t *q_starts,
                         const int32_t *q_lens, float *out, int num_spans, int num_heads, int num_kv_heads,
                         int head_dim, int block_size, int width, float scale, int num_threads) {
    const int group = num_heads / num_kv_heads;
    const int64_t row = (int64_t)num_kv_heads * head_dim;  // floats between consecutive tokens
#pragma omp parallel for num_threads(num_threads) schedule(dynamic, 1)
    for (int task = 0; task < num_spans * num_kv_heads; task++) {
        const int i = task / num_kv_heads, kh = task % num_kv_heads;
        const int b = seq_ids[i], n = q_lens[i], len = seq_lens[b];
        const int32_t *table = block_tables + (int64_t)b * width;
        const int rows = n * group;  // (query row, head of the group), query row major
        float *scores = malloc(sizeof(float) * (size_t)rows * len);
        float *acc = calloc((size_t)rows * head_dim, sizeof(float));
        for (int j = 0; j < len; j++) {
            const float *kr = k_cache + ((int64_t)table[j / block_size] * block_size + j % block_size) * row
                              + (int64_t)kh * head_dim;
            for (int r = (j - (len - n) > 0 ? j - (len - n) : 0); r < n; r++) {  // rows that see key j
                const float *qr = q + ((int64_t)(q_starts[i] + r) * num_heads + (int64_t)kh * group) * head_dim;
                for (int g = 0; g < group; g++) {
                    const float *qg = qr + (int64_t)g * head_dim;
                    float s = 0.f;
                    for (int d = 0; d < head_dim; d++) s += qg[d] * kr[d];
                    scores[(int64_t)(r * group + g) * len + j] = s * scale;
                }
            }
        }
        for (int r = 0; r < n; r++) {
            const int seen = len - n + r + 1;
            for (int g = 0; g < group; g++) {
                float *sg = scores + (int64_t)(r * group + g) * len, m = sg[0], sum = 0.f;
                for (int j = 1; j < seen; j++) m = sg[j] > m ? sg[j] : m;
                for (int j = 0; j < seen; j++) { sg[j] = expf(sg[j] - m); sum += sg[j]; }
                for (int j = 0; j < seen; j++) sg[j] /= sum;
            }
        }
        for (int j = 0; j < len; j++) {
            const float *vr = v_cache + ((int64_t)table[j / block_size] * block_size + j % block_size) * row
                              + (int64_t)kh * head_dim;
            for (int r = (j - (len - n) > 0 ? j - (len - n) : 0); r < n; r++) {
                for (int g = 0; g < group; g++) {
                    const float p = scores[(int64_t)(r * group + g) * len + j];
                    float *ag = acc + (int64_t)(r * group + g) * head_dim;
                    for (int d = 0; d < head_dim; d++) ag[d] += p * vr[d];
                }
            }
        }
        for (int r = 0; r < n; r++) {
            float *orow = out + ((int64_t)(q_starts[i] + r) * num_heads + (int64_t)kh * group) * head_dim;
            const float *arow = acc + (int64_t)r * group * head_dim;
            for (int x = 0; x < group * head_dim; x++) orow[x] = arow[x];
        }
        free(scores);
        free(acc);
    }
}
