/* The compiled engine's outputs (_fastpath_out.c), for its forwarding pass (_fastpath.c). */
#ifndef FLOWNET_FASTPATH_OUT_H
#define FLOWNET_FASTPATH_OUT_H
#include "_fastpath_tables.h"

/* Make the outputs the plan in e describes (runs, copies, dirty links; d: the input's
 * bytes, data: the input object, for views of it), then forget the plan, even when
 * failed (an error is set already: nothing is built, NULL is returned). With in_place
 * (d is writable, and every frame planned goes to one link, its payload copied), a link
 * whose frames lie back to back in d has their headers rewritten there and gets a view of
 * them instead of a copy. Returns the list of (link, out, frames), or NULL with an error
 * set. */
PyObject *fp_build_outputs(Engine *e, const uint8_t *d, PyObject *data, int failed,
                           int in_place);

#endif
