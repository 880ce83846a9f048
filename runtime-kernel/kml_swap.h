/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Weight hot-swap for a kmlc module (kml_swap.c, docs/weights.md)
 *
 * kml_swap_init() adds the module's files /sys/module/<module>/weights,
 * weights_version and rollback; *cur is the pointer the model's
 * inferences read (kml_set_read_begin() in kml_weights.h): the running set
 * and its generation, NULL for the compiled set at load (generation 0).
 * kml_swap_exit() removes them and frees every set it published, once no
 * inference can hold one: call it after the hook, the model's last user in
 * the module, is gone.
 */
#ifndef KML_SWAP_H
#define KML_SWAP_H

#include "kml_weights.h"

int kml_swap_init(const struct kml_set_desc *desc, const struct kml_set_ref __rcu **cur);
void kml_swap_exit(void);

#endif /* KML_SWAP_H */
