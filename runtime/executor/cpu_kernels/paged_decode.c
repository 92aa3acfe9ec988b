// Paged-attention decode on the CPU (fp32): one query token per sequence, K/V read in place
// through the block table (no gathered copy). One task per (sequence, KV head): the `group`
// query heads sharing that KV head read each K/V row once. Two passes over the context
// (scores, then the weighted sum of V) with an exact max-subtracted softmax.
//
// Layout (runtime/attention.py): q, out [B, H, D]; caches [num_blocks, block_size, KVH, D];
// block_tables [B, width] int32; seq_lens [B] int32.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

void paged_decode_f32(const float *q, const float *k_cache, const float *v_cache, const int32_t *block_tables,
                      const int32_t *seq_lens, float *out, int num_seqs, int num_heads, int num_kv_heads,
                      int head_dim, int block_size, int width, float scale, int num_threads) {
    const int group = num_heads / num_kv_heads;
    const int64_t row = (int64_t)num_kv_heads * head_dim;  // floats between consecutive tokens
#pragma omp parallel for num_threads(num_threads) schedule(dynamic, 1)
    for (int task = 0; task < num_seqs * num_kv_heads; task++) {
        const int b = task / num_kv_heads, kh = task % num_kv_heads;
        const int len = seq_lens[b];
        const int32_t *table = block_tables + (int64_t)b * width;
        const float *qb = q + ((int64_t)b * num_heads + (int64_t)kh * group) * head_dim;
        float *scores = malloc(sizeof(float) * (size_t)group * len);
        float *acc = calloc((size_t)group * head_dim, sizeof(float));
        for (int j = 0; j < len; j++) {
            const float *kr = k_cache + ((int64_t)table[j / block_size] * block_size + j % block_size) * row
                              + (int64_t)kh * head_dim;
            for (int g = 0; g < group; g++) {
                const float *qg = qb + (int64_t)g * head_dim;
                float s = 0.f;
                for (int d = 0; d < head_dim; d++) s += qg[d] * kr[d];
                scores[(int64_t)g * len + j] = s * scale;
            }
        }
        for (int g = 0; g < group; g++) {
            float *sg = scores + (int64_t)g * len, m = sg[0], sum = 0.f;
            for (int j = 1; j < len; j++) m = sg[j] > m ? sg[j] : m;
            for (int j = 0; j < len; j++) { sg[j] = expf(sg[j] - m); sum += sg[j]; }
            for (int j = 0; j < len; j++) sg[j] /= sum;
        }
        for (int j = 0; j < len; j++) {
            const float *vr = v_cache + ((int64_t)table[j / block_size] * block_size + j % block_size) * row
                              + (int64_t)kh * head_dim;
            for (int g = 0; g < group; g++) {
                const float p = scores[(int64_t)g * len + j];
                float *ag = acc + (int64_t)g * head_dim;
                for (int d = 0; d < head_dim; d++) ag[d] += p * vr[d];
            }
        }
        float *ob = out + ((int64_t)b * num_heads + (int64_t)kh * group) * head_dim;
        for (int i = 0; i < group * head_dim; i++) ob[i] = acc[i];
        free(scores);
        free(acc);
    }
}
