/* UTF-8 validation at memory speed: whole buffers 32 bytes at a time.
 *
 * The check is the lookup method of Keiser and Lemire ("Validating UTF-8 in less than one
 * instruction per byte", 2021): each byte and the one before it index three 16-entry tables
 * by nibble; the AND of the three lookups has a bit set for every error a pair of bytes can
 * show (too short, too long, overlong, surrogate, above U+10FFFF, a continuation byte with no
 * lead), except that two continuation bytes in a row are also flagged, and those are the ones
 * that must follow a 3- or 4-byte lead two or three bytes back. Blocks of ASCII after ASCII
 * skip the tables. The tail is checked as a block padded with zeros, so a sequence cut off at
 * the end shows as too short. Without AVX2 (another CPU or compiler) a scalar loop does it.
 *
 * A buffer holding strings back to back is valid, string by string, exactly when the whole is
 * valid and no string starts on a continuation byte: utf8_strings_valid checks both. */
#ifndef ARROWSTASH_UTF8_H
#define ARROWSTASH_UTF8_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Byte by byte, with an 8-byte ASCII skip: for short strings and CPUs without AVX2. */
static int utf8_scalar(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ULL)) {
                i += 8;
                continue;
            }
        }
        uint8_t ch = s[i];
        if (ch < 0x80) {
            i++;
        } else if (ch < 0xC2) {
            return 0;
        } else if (ch < 0xE0) {
            if (i + 1 >= n || (s[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
        } else if (ch < 0xF0) {
            if (i + 2 >= n) return 0;
            uint8_t c1 = s[i + 1], c2 = s[i + 2];
            if ((c1 & 0xC0) != 0x80 || (c2 & 0xC0) != 0x80) return 0;
            if (ch == 0xE0 && c1 < 0xA0) return 0; /* overlong */
            if (ch == 0xED && c1 >= 0xA0) return 0; /* surrogate */
            i += 3;
        } else if (ch < 0xF5) {
            if (i + 3 >= n) return 0;
            uint8_t c1 = s[i + 1], c2 = s[i + 2], c3 = s[i + 3];
            if ((c1 & 0xC0) != 0x80 || (c2 & 0xC0) != 0x80 || (c3 & 0xC0) != 0x80) return 0;
            if (ch == 0xF0 && c1 < 0x90) return 0; /* overlong */
            if (ch == 0xF4 && c1 >= 0x90) return 0; /* beyond U+10FFFF */
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

/* All ASCII? 8 bytes at a time: for CPUs without AVX2. */
static int ascii_scalar(const uint8_t *p, size_t n) {
    uint64_t acc = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        acc |= w;
    }
    for (; i < n; i++) acc |= p[i];
    return !(acc & 0x8080808080808080ULL);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define UTF8_HAVE_AVX2 1

/* error bits of a pair of bytes (previous, current) */
#define U8_TOO_SHORT (1 << 0)  /* a lead not followed by a continuation */
#define U8_TOO_LONG (1 << 1)   /* ASCII followed by a continuation */
#define U8_OVERLONG_3 (1 << 2) /* E0 80..9F */
#define U8_TOO_LARGE (1 << 3)  /* F4 90..BF, F5..FF 90..BF */
#define U8_SURROGATE (1 << 4)  /* ED A0..BF */
#define U8_OVERLONG_2 (1 << 5) /* C0, C1 */
#define U8_TOO_LARGE_1000 (1 << 6) /* F5..FF 80..8F */
#define U8_OVERLONG_4 (1 << 6) /* F0 80..8F */
#define U8_TWO_CONTS (1 << 7)  /* continuation after continuation */
#define U8_CARRY (U8_TOO_SHORT | U8_TOO_LONG | U8_TWO_CONTS)

#define U8_TABLE(...) _mm256_setr_epi8(__VA_ARGS__, __VA_ARGS__)

__attribute__((target("avx2"))) static inline __m256i u8_block_errors(__m256i in, __m256i prev) {
    /* the bytes 1, 2 and 3 places before each byte of `in` */
    __m256i carried = _mm256_permute2x128_si256(prev, in, 0x21);
    __m256i prev1 = _mm256_alignr_epi8(in, carried, 15);
    __m256i prev2 = _mm256_alignr_epi8(in, carried, 14);
    __m256i prev3 = _mm256_alignr_epi8(in, carried, 13);
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i byte_1_high = U8_TABLE(
        U8_TOO_LONG, U8_TOO_LONG, U8_TOO_LONG, U8_TOO_LONG, U8_TOO_LONG, U8_TOO_LONG,
        U8_TOO_LONG, U8_TOO_LONG, U8_TWO_CONTS, U8_TWO_CONTS, U8_TWO_CONTS, U8_TWO_CONTS,
        U8_TOO_SHORT | U8_OVERLONG_2, U8_TOO_SHORT,
        U8_TOO_SHORT | U8_OVERLONG_3 | U8_SURROGATE,
        U8_TOO_SHORT | U8_TOO_LARGE | U8_TOO_LARGE_1000 | U8_OVERLONG_4);
    const __m256i byte_1_low = U8_TABLE(
        U8_CARRY | U8_OVERLONG_3 | U8_OVERLONG_2 | U8_OVERLONG_4, U8_CARRY | U8_OVERLONG_2,
        U8_CARRY, U8_CARRY, U8_CARRY | U8_TOO_LARGE,
        U8_CARRY | U8_TOO_LARGE | U8_TOO_LARGE_1000, U8_CARRY | U8_TOO_LARGE | U8_TOO_LARGE_1000,
        U8_CARRY | U8_TOO_LARGE | U8_TOO_LARGE_1000, U8_CARRY | U8_TOO_LARGE | U8_TOO_LARGE_1000,
        U8_CARRY | U8_TOO_LARGE | U8_TOO_LARGE_1000, U8_CARRY | U8_TOO_LARGE | U8_TOO_LARGE_1000,
        U8_CARRY | U8_TOO_LARGE | U8_TOO_LARGE_1000, U8_CARRY | U8_TOO_LARGE | U8_TOO_LARGE_1000,
        U8_CARRY | U8_TOO_LARGE | U8_TOO_LARGE_1000 | U8_SURROGATE,
        U8_CARRY | U8_TOO_LARGE | U8_TOO_LARGE_1000, U8_CARRY | U8_TOO_LARGE | U8_TOO_LARGE_1000);
    const __m256i byte_2_high = U8_TABLE(
        U8_TOO_SHORT, U8_TOO_SHORT, U8_TOO_SHORT, U8_TOO_SHORT, U8_TOO_SHORT, U8_TOO_SHORT,
        U8_TOO_SHORT, U8_TOO_SHORT,
        U8_TOO_LONG | U8_OVERLONG_2 | U8_TWO_CONTS | U8_OVERLONG_3 | U8_TOO_LARGE_1000 |
            U8_OVERLONG_4,
        U8_TOO_LONG | U8_OVERLONG_2 | U8_TWO_CONTS | U8_OVERLONG_3 | U8_TOO_LARGE,
        U8_TOO_LONG | U8_OVERLONG_2 | U8_TWO_CONTS | U8_SURROGATE | U8_TOO_LARGE,
        U8_TOO_LONG | U8_OVERLONG_2 | U8_TWO_CONTS | U8_SURROGATE | U8_TOO_LARGE,
        U8_TOO_SHORT, U8_TOO_SHORT, U8_TOO_SHORT, U8_TOO_SHORT);
    __m256i a = _mm256_shuffle_epi8(byte_1_high, _mm256_and_si256(_mm256_srli_epi16(prev1, 4), low4));
    __m256i b = _mm256_shuffle_epi8(byte_1_low, _mm256_and_si256(prev1, low4));
    __m256i c = _mm256_shuffle_epi8(byte_2_high, _mm256_and_si256(_mm256_srli_epi16(in, 4), low4));
    __m256i special = _mm256_and_si256(_mm256_and_si256(a, b), c);
    /* 0x80 where a byte is the 3rd of a 3- or 4-byte sequence or the 4th of a 4-byte one */
    __m256i third = _mm256_subs_epu8(prev2, _mm256_set1_epi8((char)(0xE0 - 0x80)));
    __m256i fourth = _mm256_subs_epu8(prev3, _mm256_set1_epi8((char)(0xF0 - 0x80)));
    __m256i must = _mm256_and_si256(_mm256_or_si256(third, fourth), _mm256_set1_epi8((char)0x80));
    return _mm256_xor_si256(must, special);
}

__attribute__((target("avx2"))) static int utf8_avx2(const uint8_t *s, size_t n) {
    __m256i prev = _mm256_setzero_si256(), err = _mm256_setzero_si256();
    int prev_ascii = 1;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i in = _mm256_loadu_si256((const __m256i *)(s + i));
        int ascii = _mm256_movemask_epi8(in) == 0;
        if (!(ascii && prev_ascii)) err = _mm256_or_si256(err, u8_block_errors(in, prev));
        prev = in, prev_ascii = ascii;
    }
    uint8_t tail[32] = {0};
    memcpy(tail, s + i, n - i);
    __m256i in = _mm256_loadu_si256((const __m256i *)tail);
    err = _mm256_or_si256(err, u8_block_errors(in, prev));
    return _mm256_testz_si256(err, err);
}

/* All ASCII? 32 bytes at a time: most strings are, and then their check is this pass. It
 * stops at the first 128 bytes with a byte that is not, so that text in other scripts, which
 * utf8_avx2 reads next, is not read twice. */
__attribute__((target("avx2"))) static int ascii_avx2(const uint8_t *s, size_t n) {
    __m256i acc = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 128 <= n; i += 128) {
        const __m256i *v = (const __m256i *)(s + i);
        __m256i any = _mm256_or_si256(_mm256_or_si256(_mm256_loadu_si256(v), _mm256_loadu_si256(v + 1)),
                                      _mm256_or_si256(_mm256_loadu_si256(v + 2), _mm256_loadu_si256(v + 3)));
        if (_mm256_movemask_epi8(any)) return 0;
    }
    for (; i + 32 <= n; i += 32) acc = _mm256_or_si256(acc, _mm256_loadu_si256((const __m256i *)(s + i)));
    uint8_t rest = 0;
    for (; i < n; i++) rest |= s[i];
    return !_mm256_movemask_epi8(acc) && rest < 0x80;
}

static int utf8_use_avx2 = -1; /* -1: not asked yet */

static inline int utf8_valid(const uint8_t *s, size_t n) {
    if (n < 16) return utf8_scalar(s, n);
    if (utf8_use_avx2 < 0) utf8_use_avx2 = __builtin_cpu_supports("avx2") != 0;
    return utf8_use_avx2 ? utf8_avx2(s, n) : utf8_scalar(s, n);
}

static inline int utf8_ascii(const uint8_t *s, size_t n) {
    if (n < 32) return ascii_scalar(s, n);
    if (utf8_use_avx2 < 0) utf8_use_avx2 = __builtin_cpu_supports("avx2") != 0;
    return utf8_use_avx2 ? ascii_avx2(s, n) : ascii_scalar(s, n);
}
#else
static inline int utf8_valid(const uint8_t *s, size_t n) { return utf8_scalar(s, n); }
static inline int utf8_ascii(const uint8_t *s, size_t n) { return ascii_scalar(s, n); }
#endif

/* 1 if any of strings k in [from, to) starts on a continuation byte (see utf8_strings_valid),
 * without a branch per string: an empty string's "first byte" is the next one's, or none at the
 * end, so data[begin] stands in for a string at or past `end`, its result masked. */
static unsigned starts_bad_scalar(const uint8_t *data, const int32_t *off, int64_t from,
                                  int64_t to, int32_t begin, int32_t end) {
    unsigned bad = 0;
    for (int64_t k = from; k < to; k++) {
        unsigned inside = off[k] < end;
        int32_t at = inside ? off[k] : begin;
        bad |= ((data[at] & 0xC0) == 0x80) & inside;
    }
    return bad;
}

#ifdef UTF8_HAVE_AVX2
/* The same, 8 strings a step: their first bytes fetched in one gather. A gather lane reads 4
 * bytes from a string's first, so the steps stop where the 8th string starts within 3 bytes of
 * `end` (then every string of the step starts before `end`, and nothing past it is read); the
 * rest goes the scalar way. */
__attribute__((target("avx2"))) static unsigned starts_bad_avx2(const uint8_t *data,
                                                                const int32_t *off, int64_t from,
                                                                int64_t to, int32_t begin,
                                                                int32_t end) {
    const __m256i top2 = _mm256_set1_epi32(0xC0), cont = _mm256_set1_epi32(0x80);
    __m256i bad = _mm256_setzero_si256();
    int64_t k = from;
    for (; k + 8 <= to && off[k + 7] <= end - 4; k += 8) {
        __m256i at = _mm256_loadu_si256((const __m256i *)(off + k));
        __m256i first = _mm256_i32gather_epi32((const int *)data, at, 1);
        bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(_mm256_and_si256(first, top2), cont));
    }
    return (!_mm256_testz_si256(bad, bad)) | starts_bad_scalar(data, off, k, to, begin, end);
}
#endif

/* Strings back to back in data, string k at [off[k], off[k + 1]), k in [from, to): all valid
 * UTF-8? One pass over the bytes, then a look at each string's first byte. */
static inline int utf8_strings_valid(const uint8_t *data, const int32_t *off, int64_t from,
                                     int64_t to) {
    int32_t begin = off[from], end = off[to];
    if (begin == end) return 1;
    if (!utf8_valid(data + begin, (size_t)(end - begin))) return 0;
#ifdef UTF8_HAVE_AVX2
    if (utf8_use_avx2 > 0) return !starts_bad_avx2(data, off, from, to, begin, end);
#endif
    return !starts_bad_scalar(data, off, from, to, begin, end);
}

#endif
