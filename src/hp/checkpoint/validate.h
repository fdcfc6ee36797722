// Structural checks of checkpoint metadata, run whenever metadata.json is parsed, so that
// a damaged or hand-edited file is refused before any byte is read through it.
#pragma once

#include <string>

#include "hp/checkpoint/format.h"

namespace hp::checkpoint {

// Whether `file` names a file inside the checkpoint directory: a plain name, no path.
bool is_plain_file_name(const std::string& file);

// Errors (naming `source`, the tensor and the chunk) unless, for every tensor: its dtype is
// known and its shape non-negative; every chunk has the tensor's rank, 0 <= offset,
// offset + size <= shape, lies in a listed file under a plain name, with
// 8 <= begin <= end <= the file's size, end - begin bytes for its sizes and one checksum
// per block (hp checkpoints always have them); chunks do not overlap and, when `whole`,
// cover the tensor.
void validate_metadata(const Metadata& m, const std::string& source, bool whole = true);

}  // namespace hp::checkpoint
