/* The Arrow C Data Interface's array, which the native encoder reads and the native decoder
 * hands over (ABI-stable: the struct of the specification, no Arrow headers needed). */
#ifndef ARROWSTASH_ARROW_C_H
#define ARROWSTASH_ARROW_C_H

#include <stdint.h>

struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

#endif
