"""The images room: images of a guest's memory (``_image``), their files (``_imagefile``),
the lz4 codec (``_lz4``) and dirty-page tracking (``_dirty``). Imports the engine and files
rooms and the runtime's leaf records only."""

__all__: list[str] = []
