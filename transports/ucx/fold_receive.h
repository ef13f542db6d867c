// A receive that folds the message into its destination as UCX hands over each piece, through a
// UCP generic datatype whose unpack reduces instead of copying (Transport::recvFolded).
//
// Over TCP UCX receives every byte into its own buffers and copies it out to the receive's
// buffer; a receive into a bounce buffer followed by a reduction then writes each byte once
// more and reads it back. Folding in unpack reads it once, from UCX's buffer while it is still
// in cache. Torch-free.
#pragma once

#include <ucp/api/ucp.h>

#include "transports/fold_target.h"

namespace ucxb::ucx {

// The generic datatype of folding receives: ucp_tag_recv_nbx gets a FoldTarget*
// (transports/fold_target.h) as its buffer and a count of 1. Made once per process (generic
// datatypes belong to no context).
ucp_datatype_t foldDatatype();

}  // namespace ucxb::ucx
